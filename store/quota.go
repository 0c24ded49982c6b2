package store

// Usage is what a room holds, as its quota counts it: its keys, and the
// sum of their keys' and values' lengths.
type Usage struct {
	Keys  int64
	Bytes int64
}

// after returns u once events have committed.
func (u Usage) after(events []Event) Usage {
	for i := range events {
		ev := &events[i]
		if ev.Prev != nil {
			u.Keys--
			u.Bytes -= int64(len(ev.Prev.Key) + len(ev.Prev.Value))
		}
		if ev.Type == OpPut {
			u.Keys++
			u.Bytes += int64(len(ev.KV.Key) + len(ev.KV.Value))
		}
	}
	return u
}

// checkQuota refuses a write that takes a room from before to after when
// it grows a measure past its limit. A write that does not grow what is
// over passes, so a room past its quota (its limit lowered since) can
// always be shrunk.
func (l Limits) checkQuota(before, after Usage) error {
	l = l.WithDefaults()
	maxKeys, maxBytes := int64(l.MaxRoomKeys), l.MaxRoomBytes
	if (after.Keys > maxKeys && after.Keys > before.Keys) || (after.Bytes > maxBytes && after.Bytes > before.Bytes) {
		return &QuotaError{Keys: after.Keys, Bytes: after.Bytes, MaxKeys: maxKeys, MaxBytes: maxBytes}
	}
	return nil
}
