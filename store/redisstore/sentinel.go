package redisstore

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// IsSentinelURL reports whether u names a master through Sentinels
// (redis+sentinel:// or rediss+sentinel://).
func IsSentinelURL(u string) bool {
	return strings.HasPrefix(u, "redis+sentinel://") || strings.HasPrefix(u, "rediss+sentinel://")
}

// ParseSentinelURL parses
// redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]
// [?sentinel_username=U&sentinel_password=P]: the Sentinels' addresses,
// the name of the master they monitor and the database. The user and
// password are the master's (and its replicas'); the Sentinels' own, when
// they require one, go in the query. rediss+sentinel:// connects to
// Redis with TLS.
func ParseSentinelURL(raw string) (*redis.FailoverOptions, error) {
	bad := func(why string) error {
		return fmt.Errorf("store: redis sentinel url: %s (want redis+sentinel://[user:password@]host:port[,host:port...]/master[/db])", why)
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	if scheme != "redis+sentinel" && scheme != "rediss+sentinel" {
		return nil, bad("scheme " + scheme)
	}
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	o := &redis.FailoverOptions{}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		user, pass, _ := strings.Cut(authority[:i], ":")
		var err error
		if o.Username, err = url.PathUnescape(user); err != nil {
			return nil, bad("user: " + err.Error())
		}
		if o.Password, err = url.PathUnescape(pass); err != nil {
			return nil, bad("password: " + err.Error())
		}
		authority = authority[i+1:]
	}
	for _, a := range strings.Split(authority, ",") {
		host, port, err := net.SplitHostPort(strings.TrimSpace(a))
		if err != nil || host == "" || port == "" {
			return nil, bad(fmt.Sprintf("sentinel address %q", a))
		}
		o.SentinelAddrs = append(o.SentinelAddrs, net.JoinHostPort(host, port))
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if parts[0] == "" || len(parts) > 2 {
		return nil, bad("no master name")
	}
	o.MasterName = parts[0]
	if len(parts) == 2 {
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return nil, bad(fmt.Sprintf("database %q", parts[1]))
		}
		o.DB = db
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, bad(err.Error())
	}
	for k, v := range q {
		switch k {
		case "sentinel_username":
			o.SentinelUsername = v[len(v)-1]
		case "sentinel_password":
			o.SentinelPassword = v[len(v)-1]
		default:
			return nil, bad("unknown parameter " + k)
		}
	}
	if scheme == "rediss+sentinel" {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return o, nil
}
