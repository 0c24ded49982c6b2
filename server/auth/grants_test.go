package auth

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestClaimsCanReadCanWrite(t *testing.T) {
	t.Parallel()
	type check struct {
		op   string // "r" = CanRead(room, prefix), "w" = CanWrite(room, key)
		room string
		s    string
		want bool
	}
	for _, tc := range []struct {
		name   string
		claims *Claims
		checks []check
	}{
		{
			name:   "room star suffix",
			claims: &Claims{Subject: "alice", Grants: []Grant{{Room: "lobby:*", Access: Read}}},
			checks: []check{
				{"r", "lobby:eu", "", true},
				{"r", "lobby:", "", true},
				{"r", "lobby:eu:west", "x/", true},
				{"r", "lobby", "", false},
				{"r", "xlobby:eu", "", false},
				{"r", "Lobby:eu", "", false},
				{"w", "lobby:eu", "k", false},
			},
		},
		{
			name:   "room star everywhere",
			claims: &Claims{Grants: []Grant{{Room: "*", Access: ReadWrite}}},
			checks: []check{
				{"r", "a", "", true},
				{"r", "anything:at@all", "p/", true},
				{"w", "x", "any/key", true},
				{"r", "", "", true},
			},
		},
		{
			name:   "room star in the middle",
			claims: &Claims{Grants: []Grant{{Room: "game:*:chat", Access: Read}}},
			checks: []check{
				{"r", "game:1:chat", "", true},
				{"r", "game::chat", "", true},
				{"r", "game:1:2:chat", "", true},
				{"r", "game:1:chat:x", "", false},
				{"r", "game:chat", "", false},
			},
		},
		{
			name:   "exact room",
			claims: &Claims{Grants: []Grant{{Room: "lobby", Access: Read}}},
			checks: []check{
				{"r", "lobby", "", true},
				{"r", "lobby2", "", false},
				{"r", "lobb", "", false},
				{"r", "*", "", false},
			},
		},
		{
			name:   "no path semantics for slash or colon",
			claims: &Claims{Grants: []Grant{{Room: "a*", Access: Read}}},
			checks: []check{
				{"r", "a/b/c", "", true},
				{"r", "a:b:c", "", true},
			},
		},
		{
			name:   "read prefix containment",
			claims: &Claims{Grants: []Grant{{Room: "r", Prefix: "presence/", Access: Read}}},
			checks: []check{
				{"r", "r", "presence/alice", true},
				{"r", "r", "presence/", true},
				{"r", "r", "", false},
				{"r", "r", "pres", false},
				{"r", "r", "presence", false},
				{"r", "r", "other/", false},
				{"w", "r", "presence/alice", false},
			},
		},
		{
			name:   "write presence/{sub}: prefix semantics",
			claims: &Claims{Subject: "alice", Grants: []Grant{{Room: "lobby:*", Prefix: "presence/{sub}", Access: ReadWrite}}},
			checks: []check{
				{"w", "lobby:1", "presence/alice", true},
				{"w", "lobby:1", "presence/alice/x", true},
				{"w", "lobby:1", "presence/bob", false},
				{"w", "lobby:1", "presence/", false},
				{"w", "lobby:1", "presence/al", false},
				{"w", "lobby:1", "presence/{sub}", false},
				{"w", "doc:1", "presence/alice", false},
				{"r", "lobby:1", "presence/alice", true},
				{"r", "lobby:1", "presence/", false},
			},
		},
		{
			name:   "{sub} in room",
			claims: &Claims{Subject: "alice", Grants: []Grant{{Room: "doc:{sub}", Access: ReadWrite}, {Room: "{sub}-{sub}", Access: Read}}},
			checks: []check{
				{"w", "doc:alice", "k", true},
				{"r", "doc:alice", "", true},
				{"w", "doc:bob", "k", false},
				{"w", "doc:{sub}", "k", false},
				{"w", "doc:alicex", "k", false},
				{"r", "alice-alice", "", true},
				{"r", "alice-bob", "", false},
			},
		},
		{
			name: "subject with a star does not widen",
			claims: &Claims{Subject: "*", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "presence/{sub}", Access: ReadWrite},
			}},
			checks: []check{
				{"w", "doc:alice", "k", false},
				{"w", "doc:*", "k", false},
				{"r", "doc:*", "", false},
				{"w", "lobby", "presence/alice", false},
				{"w", "lobby", "presence/*", false},
			},
		},
		{
			name: "subject with braces or an empty subject matches nothing",
			claims: &Claims{Subject: "{sub}", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "p/{sub}", Access: ReadWrite},
			}},
			checks: []check{
				{"w", "doc:{sub}", "k", false},
				{"w", "lobby", "p/{sub}", false},
				{"w", "lobby", "p/", false},
			},
		},
		{
			name: "empty subject",
			claims: &Claims{Subject: "", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "p/{sub}", Access: ReadWrite},
			}},
			checks: []check{
				{"w", "doc:", "k", false},
				{"w", "lobby", "p/", false},
				{"w", "lobby", "p/x", false},
			},
		},
		{
			name: "subject not a room name: room grants void, prefix grants work",
			claims: &Claims{Subject: "bob/x", Grants: []Grant{
				{Room: "doc:{sub}", Access: ReadWrite},
				{Room: "lobby", Prefix: "p/{sub}", Access: Write},
			}},
			checks: []check{
				{"w", "doc:bob/x", "k", false},
				{"w", "doc:bob", "k", false},
				{"w", "lobby", "p/bob/x", true},
				{"w", "lobby", "p/bob/xy", true},
				{"w", "lobby", "p/bob", false},
			},
		},
		{
			name:   "subject with NUL in a prefix grant",
			claims: &Claims{Subject: "a\x00", Grants: []Grant{{Room: "r", Prefix: "p/{sub}", Access: Write}}},
			checks: []check{
				{"w", "r", "p/a\x00", false},
				{"w", "r", "p/a", false},
			},
		},
		{
			name:   "a grant with a void {sub} does not hide the others",
			claims: &Claims{Subject: "", Grants: []Grant{{Room: "doc:{sub}", Access: ReadWrite}, {Room: "pub", Access: Read}}},
			checks: []check{
				{"r", "pub", "", true},
				{"w", "pub", "k", false},
			},
		},
		{
			name: "access bits",
			claims: &Claims{Grants: []Grant{
				{Room: "ro", Access: Read},
				{Room: "wo", Access: Write},
				{Room: "rw", Access: ReadWrite},
				{Room: "none", Access: 0},
			}},
			checks: []check{
				{"r", "ro", "", true}, {"w", "ro", "k", false},
				{"r", "wo", "", false}, {"w", "wo", "k", true},
				{"r", "rw", "", true}, {"w", "rw", "k", true},
				{"r", "none", "", false}, {"w", "none", "k", false},
			},
		},
		{
			name: "read and write split across grants",
			claims: &Claims{Grants: []Grant{
				{Room: "g", Prefix: "a/", Access: Read},
				{Room: "g", Prefix: "b/", Access: Write},
			}},
			checks: []check{
				{"r", "g", "a/x", true}, {"w", "g", "a/x", false},
				{"r", "g", "b/x", false}, {"w", "g", "b/x", true},
			},
		},
		{
			name:   "zero claims allow nothing",
			claims: &Claims{},
			checks: []check{{"r", "r", "", false}, {"w", "r", "k", false}},
		},
		{
			name:   "nil claims allow nothing",
			claims: nil,
			checks: []check{{"r", "r", "", false}, {"w", "r", "k", false}},
		},
		{
			name:   "anonymous allows everything",
			claims: Anonymous(),
			checks: []check{{"r", "any", "", true}, {"w", "doc:x", "presence/y", true}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, ck := range tc.checks {
				var got bool
				if ck.op == "r" {
					got = tc.claims.CanRead(ck.room, ck.s)
				} else {
					got = tc.claims.CanWrite(ck.room, ck.s)
				}
				if got != ck.want {
					t.Errorf("%s(%q, %q) = %v, want %v", map[string]string{"r": "CanRead", "w": "CanWrite"}[ck.op], ck.room, ck.s, got, ck.want)
				}
			}
		})
	}
}

func TestClaimsAnonymousAndExpiresIn(t *testing.T) {
	t.Parallel()
	anon := Anonymous()
	want := &Claims{Expiry: farFuture, Grants: []Grant{{Room: "*", Prefix: "", Access: ReadWrite}}}
	if diff := cmp.Diff(want, anon); diff != "" {
		t.Errorf("Anonymous (-want +got):\n%s", diff)
	}
	if d := anon.ExpiresIn(testNow); d < 100*365*24*time.Hour {
		t.Errorf("anonymous ExpiresIn = %v, want far future", d)
	}
	// Each call returns a fresh value: changing one does not change the next.
	anon.Grants[0].Access = 0
	if Anonymous().Grants[0].Access != ReadWrite {
		t.Error("Anonymous shares its grants")
	}
	c := &Claims{Expiry: testNow.Add(90 * time.Second)}
	if got := c.ExpiresIn(testNow); got != 90*time.Second {
		t.Errorf("ExpiresIn = %v, want 90s", got)
	}
	if got := c.ExpiresIn(testNow.Add(2 * time.Minute)); got != -30*time.Second {
		t.Errorf("ExpiresIn after expiry = %v, want -30s", got)
	}
	var nilClaims *Claims
	if got := nilClaims.ExpiresIn(testNow); got != 0 {
		t.Errorf("nil ExpiresIn = %v, want 0", got)
	}
}

func TestGrantAccessString(t *testing.T) {
	t.Parallel()
	for a, want := range map[Access]string{0: "", Read: "r", Write: "w", ReadWrite: "rw"} {
		if got := a.String(); got != want {
			t.Errorf("Access(%d).String() = %q, want %q", a, got, want)
		}
	}
}

// refGlob is a reference matcher: dynamic programming over (pattern,
// input) prefixes.
func refGlob(p, s string) bool {
	// m[j] reports whether p[:i] matches s[:j], for the current i.
	m := make([]bool, len(s)+1)
	m[0] = true
	for i := 0; i < len(p); i++ {
		next := make([]bool, len(s)+1)
		if p[i] == '*' {
			next[0] = m[0]
			for j := 1; j <= len(s); j++ {
				next[j] = m[j] || next[j-1]
			}
		} else {
			for j := 1; j <= len(s); j++ {
				next[j] = m[j-1] && p[i] == s[j-1]
			}
		}
		m = next
	}
	return m[len(s)]
}

func TestGrantGlobMatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"", "", true},
		{"", "a", false},
		{"*", "", true},
		{"*", "abc", true},
		{"**", "abc", true},
		{"a*", "a", true},
		{"a*", "ab", true},
		{"a*", "ba", false},
		{"*a", "ba", true},
		{"*a", "ab", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a*a", "aba", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "acb", false},
		{"*ab*ab*", "abab", true},
		{"*ab*ab*", "aab", false},
		{"lobby:*", "lobby:", true},
		{"x*y", "xy", true},
		{"x*y*", "xzy", true},
		{"?", "a", false},
		{"[a]", "a", false},
		{"a.b", "axb", false},
		{"*", strings.Repeat("a", maxMatchInput+1), false},
	} {
		if got := globMatch(tc.p, tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.p, tc.s, got, tc.want)
		}
	}
}

// TestGrantGlobMatchesReference compares the matcher with the reference on
// every pattern over {a, b, *} up to 6 bytes and every input over {a, b} up
// to 7 bytes.
func TestGrantGlobMatchesReference(t *testing.T) {
	t.Parallel()
	all := func(alphabet string, maxLen int) []string {
		out := []string{""}
		level := []string{""}
		for range maxLen {
			var next []string
			for _, w := range level {
				for _, c := range alphabet {
					next = append(next, w+string(c))
				}
			}
			out = append(out, next...)
			level = next
		}
		return out
	}
	inputs := all("ab", 7)
	for _, p := range all("ab*", 6) {
		for _, s := range inputs {
			if got, want := globMatch(p, s), refGlob(p, s); got != want {
				t.Fatalf("globMatch(%q, %q) = %v, reference says %v", p, s, got, want)
			}
		}
	}
}

// TestGrantGlobNoBlowup runs the inputs that make backtracking matchers
// exponential and regexp-free naive ones quadratic or worse.
func TestGrantGlobNoBlowup(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("a", maxMatchInput)
	p := strings.Repeat("*a", maxRoomPattern/2-1) + "*b"
	start := time.Now()
	for range 100 {
		if globMatch(p, s) {
			t.Fatal("matched")
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("100 adversarial matches took %v", d)
	}
	// The same through CanRead, with a room pattern as long as a token allows.
	c := &Claims{Grants: []Grant{{Room: p, Access: Read}}}
	if c.CanRead(s, "") {
		t.Fatal("CanRead matched")
	}
	if c.CanRead(strings.Repeat("a", 1<<20), "") {
		t.Fatal("CanRead matched a 1 MiB room")
	}
}

func FuzzGrantGlob(f *testing.F) {
	for _, seed := range [][2]string{{"*", ""}, {"a*b*c", "aXbYc"}, {"*ab*ab*", "abab"}, {"lobby:*", "lobby:eu"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, p, s string) {
		if len(p) > 64 || len(s) > 256 {
			return // keep the quadratic reference quick
		}
		if got, want := globMatch(p, s), refGlob(p, s); got != want {
			t.Fatalf("globMatch(%q, %q) = %v, reference says %v", p, s, got, want)
		}
	})
}
