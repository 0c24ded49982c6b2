package wire

import (
	"strconv"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// A snapshot message can be written in three parts, so that its items,
// the bulk of it, are encoded once and shared by every subscription that
// gets the same snapshot, and sent in pieces rather than copied into each
// subscriber's frame: AppendSnapshotHead (which carries the subscription
// id), the items of AppendSnapshotItems, and AppendSnapshotTail. The
// three together are byte for byte what Append writes for the Snapshot.

// AppendSnapshotHead appends (with the frame separator) a snapshot
// message up to its first item; n is the number of items that follow.
func AppendSnapshotHead(c Codec, buf []byte, s uint64, epoch string, rev uint64, reason string, n int) []byte {
	if _, ok := c.(msgpackCodec); ok {
		buf = append(buf, msgpcode.FixedMapLow|6)
		buf = appendMsgpackStr(buf, "t")
		buf = appendMsgpackStr(buf, TSnapshot)
		buf = appendMsgpackStr(buf, "s")
		buf = appendMsgpackUint(buf, s)
		buf = appendMsgpackStr(buf, "epoch")
		buf = appendMsgpackStr(buf, epoch)
		buf = appendMsgpackStr(buf, "rev")
		buf = appendMsgpackUint(buf, rev)
		buf = appendMsgpackStr(buf, "reason")
		buf = appendMsgpackStr(buf, reason)
		buf = appendMsgpackStr(buf, "items")
		return appendMsgpackLen(buf, msgpcode.FixedArrayLow, msgpcode.Array16, n)
	}
	return appendSnapshotHeadJSON(buf, TSnapshot, s, epoch, rev, reason)
}

// appendSnapshotHeadJSON appends a JSON snapshot message (of both
// versions) up to its first item.
func appendSnapshotHeadJSON(buf []byte, t string, s uint64, epoch string, rev uint64, reason string) []byte {
	buf = appendHeadJSON(buf, t, s)
	buf = append(buf, `,"epoch":`...)
	buf = appendJSONString(buf, epoch)
	buf = append(buf, `,"rev":`...)
	buf = strconv.AppendUint(buf, rev, 10)
	buf = append(buf, `,"reason":`...)
	buf = appendJSONString(buf, reason)
	return append(buf, `,"items":[`...)
}

// AppendSnapshotItems appends items in c's form; first says whether they
// begin the list (JSON separates items with commas). The JSON of protocol
// v1 is also the items of an SSE reset and of an HTTP list.
func AppendSnapshotItems(c Codec, buf []byte, items []Item, first bool) ([]byte, error) {
	for i := range items {
		it := &items[i]
		switch c.(type) {
		case msgpackCodec:
			var err error
			if buf, err = appendMsgpack(buf, it); err != nil {
				return buf, err
			}
			continue
		}
		if !first || i > 0 {
			buf = append(buf, ',')
		}
		if _, ok := c.(denseCodec); ok {
			buf = appendDenseItem(buf, it)
		} else {
			buf = AppendItemJSON(buf, it)
		}
	}
	return buf, nil
}

// AppendSnapshotTail ends a snapshot message.
func AppendSnapshotTail(c Codec, buf []byte) []byte {
	if _, ok := c.(msgpackCodec); ok {
		return buf
	}
	return append(buf, "]}"...)
}

// AppendItemJSON writes what encoding/json writes for it, by hand: a
// snapshot of a large room writes one per key.
func AppendItemJSON(buf []byte, it *Item) []byte {
	buf = append(buf, `{"key":`...)
	buf = appendJSONString(buf, it.Key)
	buf = appendValueOrNull(append(buf, `,"value":`...), it.Value)
	buf = strconv.AppendUint(append(buf, `,"create_rev":`...), it.CreateRev, 10)
	buf = strconv.AppendUint(append(buf, `,"mod_rev":`...), it.ModRev, 10)
	buf = strconv.AppendUint(append(buf, `,"version":`...), it.Version, 10)
	if it.Lease {
		buf = append(buf, `,"lease":true`...)
	}
	return append(buf, '}')
}
