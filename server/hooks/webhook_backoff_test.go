package hooks

import (
	"testing"
	"time"
)

// TestBackoffExponentialWithJitter: the wait before retry n is uniform in
// (0, min(max, min·2^(n-1))]: its bound doubles per failed attempt up to
// --webhook-max-backoff, and the waits differ (full jitter), so receivers
// coming back are not hit by every room at once.
func TestBackoffExponentialWithJitter(t *testing.T) {
	r := &run{h: &hook{w: &Webhooks{cfg: Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: 30 * time.Second}}}}
	for _, attempts := range []int{1, 2, 5, 8, 9, 12, 40} {
		bound := 30 * time.Second
		if attempts < 12 {
			bound = min(bound, 100*time.Millisecond<<(attempts-1))
		}
		var longest time.Duration
		seen := map[time.Duration]bool{}
		for range 200 {
			d := r.backoff(attempts)
			if d <= 0 || d > bound {
				t.Fatalf("attempt %d: waited %v, want in (0, %v]", attempts, d, bound)
			}
			longest = max(longest, d)
			seen[d] = true
		}
		// Of 200 uniform draws, none above half the bound: 2^-200.
		if longest <= bound/2 {
			t.Errorf("attempt %d: longest wait %v of 200, want some above %v (the bound grows)", attempts, longest, bound/2)
		}
		if len(seen) < 100 {
			t.Errorf("attempt %d: %d distinct waits of 200: want jitter", attempts, len(seen))
		}
	}
}
