package rooms_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Engine test closes what it starts; no goroutine may outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
