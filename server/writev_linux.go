//go:build linux

package server

import (
	"syscall"
	"unsafe"
)

const haveWritev = true

// writevNoWait writes a and then b to the non-blocking socket fd with one
// writev and returns how many bytes it took: 0 with a nil error when it
// took none (EAGAIN). The iovecs are on the stack: no allocation.
func writevNoWait(fd uintptr, a, b []byte) (int, error) {
	var iov [2]syscall.Iovec
	k := 0
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			iov[k].Base = &p[0]
			iov[k].SetLen(len(p))
			k++
		}
	}
	if k == 0 {
		return 0, nil
	}
	for {
		n, _, e := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(k))
		switch e {
		case 0:
			return int(n), nil
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, nil
		default:
			return 0, e
		}
	}
}
