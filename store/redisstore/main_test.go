package redisstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// store must stop what it starts by the time Close returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
