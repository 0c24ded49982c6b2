package hooks

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/statecast/statecast/server/auth"
)

// Route sends the rooms that Pattern matches to URL. Pattern is a room
// pattern as in a grant: '*' matches any run of characters ("game:*",
// "*"), every other character itself (auth.MatchRoom).
type Route struct {
	Pattern string
	URL     string
}

// ParseRoute reads a route spelt PATTERN=URL, as the repeatable flags
// (--hook-validate 'game:*=http://app.internal/hooks/validate') give
// it. The URL must be absolute http or https.
func ParseRoute(spec string) (Route, error) {
	pattern, u, ok := strings.Cut(spec, "=")
	if !ok || pattern == "" || u == "" {
		return Route{}, fmt.Errorf("hook %q: want ROOM_PATTERN=URL, e.g. 'game:*=http://127.0.0.1:9000/validate'", spec)
	}
	if strings.Contains(pattern, "{sub}") {
		return Route{}, fmt.Errorf("hook %q: {sub} has no meaning in a hook's room pattern", spec)
	}
	if err := auth.CheckRoomPattern(pattern); err != nil {
		return Route{}, fmt.Errorf("hook %q: room pattern: %v", spec, err)
	}
	if err := checkURL(u); err != nil {
		return Route{}, fmt.Errorf("hook %q: %v", spec, err)
	}
	return Route{Pattern: pattern, URL: u}, nil
}

// checkURL accepts an absolute http or https URL with a host.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("URL: %v", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("URL: the scheme must be http or https")
	case u.Host == "":
		return errors.New("URL: no host")
	}
	return nil
}

// Routes are routes in the order given: the first whose pattern matches
// a room is the room's, so a specific pattern listed before a general
// one wins.
type Routes []Route

// ParseRoutes reads every spec with ParseRoute.
func ParseRoutes(specs []string) (Routes, error) {
	rs := make(Routes, 0, len(specs))
	for _, spec := range specs {
		r, err := ParseRoute(spec)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// Match returns the first route whose pattern matches room.
func (rs Routes) Match(room string) (Route, bool) {
	for _, r := range rs {
		if auth.MatchRoom(r.Pattern, room) {
			return r, true
		}
	}
	return Route{}, false
}
