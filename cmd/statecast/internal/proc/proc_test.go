package proc

import (
	"slices"
	"testing"
)

func TestSplitQuote(t *testing.T) {
	for _, line := range []string{`/bin/x -a 'b c' "d e" f\ g`, `x ''`} {
		args, err := Split(line)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Split(Quote(args))
		if err != nil || !slices.Equal(args, again) {
			t.Errorf("%q → %q → %q (%v)", line, args, again, err)
		}
	}
	if args, _ := Split(`/bin/x -a 'b c' "d e" f\ g`); !slices.Equal(args, []string{"/bin/x", "-a", "b c", "d e", "f g"}) {
		t.Errorf("split: %q", args)
	}
	if _, err := Split(`x 'y`); err == nil {
		t.Error("unterminated quote accepted")
	}
}

func TestTail(t *testing.T) {
	tail := NewTail(4)
	for _, s := range []string{"ab", "cde", "f"} {
		if n, err := tail.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := tail.String(); got != "cdef" {
		t.Errorf("tail = %q, want the last 4 bytes %q", got, "cdef")
	}
}
