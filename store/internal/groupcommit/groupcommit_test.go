package groupcommit

import (
	"slices"
	"testing"
)

func TestFill(t *testing.T) {
	size := func(n int) int { return n }
	q := make(chan int, 10)
	for _, n := range []int{1, 1, 1, 1, 1} {
		q <- n
	}
	if got := Fill([]int{1}, q, 3, 100, size); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("bounded by count: %v", got)
	}
	if got := Fill([]int{5}, q, 10, 6, size); !slices.Equal(got, []int{5, 1}) {
		t.Errorf("bounded by bytes: %v", got)
	}
	if got := Fill([]int{7}, q, 10, 6, size); !slices.Equal(got, []int{7}) {
		t.Errorf("a first write over the bytes goes alone: %v", got)
	}
	if got := Fill([]int{1}, q, 10, 100, size); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("what is queued now, without waiting: %v", got)
	}
	q <- 2
	close(q)
	if got := Fill([]int{1}, q, 10, 100, size); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("up to a closed queue: %v", got)
	}
}

func TestHandover(t *testing.T) {
	var a, b Handover
	if !a.Take() || a.Abandon() || a.Take() {
		t.Error("taken: neither abandoned nor taken again")
	}
	if !b.Abandon() || b.Take() {
		t.Error("abandoned: never taken")
	}
}
