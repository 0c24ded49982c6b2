package hooks

import (
	"fmt"
	"path"
	"strings"
)

// roomPattern matches room names with path.Match syntax ("doc:*",
// "game:??"): room names hold no '/', so '*' spans the whole rest.
type roomPattern string

func parseRoomPattern(p string) (roomPattern, error) {
	if p == "" {
		return "", fmt.Errorf("empty room pattern")
	}
	if _, err := path.Match(p, ""); err != nil {
		return "", fmt.Errorf("room pattern %q: %w", p, err)
	}
	if strings.ContainsAny(p, "/{}") {
		return "", fmt.Errorf("room pattern %q: room names hold no '/', '{' or '}'", p)
	}
	return roomPattern(p), nil
}

func (p roomPattern) match(room string) bool {
	ok, _ := path.Match(string(p), room)
	return ok
}
