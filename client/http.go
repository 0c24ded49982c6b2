package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/statecast/statecast/server/wire"
)

// HTTP is a client of the HTTP API. Its zero value is not usable: set URL
// (e.g. http://127.0.0.1:8080). Safe for concurrent use.
type HTTP struct {
	URL    string       // the server's base URL
	Token  string       // sent as a bearer token when set
	Client *http.Client // nil: http.DefaultClient
}

// List is the reply of a list: the items under a prefix at Rev.
type List struct {
	Epoch string      `json:"epoch"`
	Rev   uint64      `json:"rev"`
	Items []wire.Item `json:"items"`
}

// roomPath is /v1/rooms/{room}, plus "/"+rest when rest is not empty.
func roomPath(room, rest string) string {
	p := "/v1/rooms/" + url.PathEscape(room)
	if rest != "" {
		p += "/" + rest
	}
	return p
}

// keyPath escapes each '/'-separated part of key on its own, so that '/'
// stays a separator the server reads back as part of the key.
func keyPath(room, key string) string {
	parts := strings.Split(key, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return roomPath(room, "kv/"+strings.Join(parts, "/"))
}

// request builds a request for path (already escaped) and query.
func (h *HTTP) request(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Request, error) {
	u := strings.TrimRight(h.URL, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if h.Token != "" {
		req.Header.Set("Authorization", "Bearer "+h.Token)
	}
	return req, nil
}

func (h *HTTP) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return http.DefaultClient
}

// do sends req and decodes a 2xx JSON body into out, or the error body
// into an *Error.
func (h *HTTP) do(req *http.Request, out any) (*http.Response, error) {
	resp, err := h.client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return resp, httpError(resp)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp, fmt.Errorf("client: %s %s: bad reply: %w", req.Method, req.URL.Path, err)
		}
	}
	return resp, nil
}

// decodeHTTPError reads an {"error":{...}} body, or returns nil.
func decodeHTTPError(resp *http.Response) *Error {
	if resp.Body == nil {
		return nil
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Key     string `json:"key"`
			ModRev  uint64 `json:"mod_rev"`
			Rev     uint64 `json:"rev"`
			Line    int    `json:"line"`
			Column  int    `json:"column"`
		} `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &body) != nil || body.Error.Code == "" {
		return nil
	}
	e := body.Error
	return &Error{Code: e.Code, Message: e.Message, Key: e.Key, ModRev: e.ModRev, Rev: e.Rev, Line: e.Line, Column: e.Column, Status: resp.StatusCode}
}

// httpError is the *Error of a failed response, made up from the status
// when the body does not carry one (a proxy's error page, say).
func httpError(resp *http.Response) *Error {
	if e := decodeHTTPError(resp); e != nil {
		return e
	}
	code := wire.CodeInternal
	switch resp.StatusCode {
	case http.StatusBadRequest:
		code = wire.CodeBadRequest
	case http.StatusUnauthorized:
		code = wire.CodeUnauthorized
	case http.StatusForbidden:
		code = wire.CodeForbidden
	case http.StatusNotFound:
		code = wire.CodeNotFound
	case http.StatusTooManyRequests:
		code = wire.CodeRateLimited
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		code = wire.CodeUnavailable
	}
	return &Error{Code: code, Message: "HTTP " + resp.Status, Status: resp.StatusCode}
}

// ReadOptions choose a read's consistency (PROTOCOL.md §9). The zero
// value is a linearizable read: it reflects every write acknowledged
// before it began, on any node.
type ReadOptions struct {
	// Serializable reads the node's view at once: faster, but it may miss
	// writes acknowledged by other nodes moments ago.
	Serializable bool
	// MinRev makes a serializable read at least as fresh as a revision
	// already seen (say on another node).
	MinRev uint64
	// Filter (List only) keeps the keys whose value passes this CEL
	// expression.
	Filter string
}

func (o ReadOptions) query(q url.Values) url.Values {
	if !o.Serializable && o.MinRev == 0 && o.Filter == "" {
		return q
	}
	if q == nil {
		q = url.Values{}
	}
	if o.Serializable {
		q.Set("consistency", "serializable")
	}
	if o.MinRev > 0 {
		q.Set("min_rev", strconv.FormatUint(o.MinRev, 10))
	}
	if o.Filter != "" {
		q.Set("filter", o.Filter)
	}
	return q
}

// List returns the keys of room under prefix ("" = all), sorted.
func (h *HTTP) List(ctx context.Context, room, prefix string) (*List, error) {
	return h.ListWith(ctx, room, prefix, ReadOptions{})
}

// ListWith is List with a consistency. It reads the list in pages
// (ListPageKeys keys each), every page at the first page's revision, so
// the list is the room at one revision however large it is.
func (h *HTTP) ListWith(ctx context.Context, room, prefix string, o ReadOptions) (*List, error) {
	q := url.Values{"limit": {strconv.Itoa(ListPageKeys)}}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	var l *List
	for {
		req, err := h.request(ctx, http.MethodGet, roomPath(room, "kv"), o.query(q), nil)
		if err != nil {
			return nil, err
		}
		var p listPage
		if _, err := h.do(req, &p); err != nil {
			return nil, err
		}
		if l == nil {
			l = &p.List
		} else if p.Epoch != l.Epoch || p.Rev != l.Rev {
			return nil, fmt.Errorf("client: a page of the list of %q is at %s/%d, not the first page's %s/%d", room, p.Epoch, p.Rev, l.Epoch, l.Rev)
		} else {
			l.Items = append(l.Items, p.Items...)
		}
		if !p.More {
			return l, nil
		}
		q.Set("after", p.Next)
		q.Set("rev", strconv.FormatUint(l.Rev, 10))
		o.MinRev = 0 // the first page was as fresh as asked
	}
}

// ListPageKeys is how many keys each page of a List asks for.
const ListPageKeys = 1000

// listPage is one page of a paged list.
type listPage struct {
	List
	More bool   `json:"more"`
	Next string `json:"next"`
}

// Get returns one key and the room's revision it was read at; a missing
// key is ErrNotFound.
func (h *HTTP) Get(ctx context.Context, room, key string) (wire.Item, uint64, error) {
	return h.GetWith(ctx, room, key, ReadOptions{})
}

// GetWith is Get with a consistency.
func (h *HTTP) GetWith(ctx context.Context, room, key string, o ReadOptions) (wire.Item, uint64, error) {
	o.Filter = "" // a list's option
	req, err := h.request(ctx, http.MethodGet, keyPath(room, key), o.query(nil), nil)
	if err != nil {
		return wire.Item{}, 0, err
	}
	var it wire.Item
	resp, err := h.do(req, &it)
	if err != nil {
		return wire.Item{}, 0, err
	}
	rev, _ := strconv.ParseUint(resp.Header.Get("X-Statecast-Rev"), 10, 64)
	return it, rev, nil
}

// Put writes value (one JSON value) to key. ifRev, when set, is the
// mod_rev the key must have (0: must not exist), else ErrConflict; lease
// is a TTL lease id, KeepLease (the key keeps its current lease), or ""
// (the key is bound to no lease).
func (h *HTTP) Put(ctx context.Context, room, key string, value json.RawMessage, ifRev *uint64, lease string) (uint64, error) {
	var q url.Values
	if lease != "" {
		q = url.Values{"lease": {lease}}
	}
	if value == nil {
		value = json.RawMessage("null")
	}
	req, err := h.request(ctx, http.MethodPut, keyPath(room, key), q, value)
	if err != nil {
		return 0, err
	}
	return h.write(req, ifRev)
}

// Delete deletes key, conditionally as Put; deleting a missing key writes
// nothing and returns the current revision.
func (h *HTTP) Delete(ctx context.Context, room, key string, ifRev *uint64) (uint64, error) {
	req, err := h.request(ctx, http.MethodDelete, keyPath(room, key), nil, nil)
	if err != nil {
		return 0, err
	}
	return h.write(req, ifRev)
}

// Txn applies ops atomically if every cond holds.
func (h *HTTP) Txn(ctx context.Context, room string, conds []wire.Cond, ops []wire.TxnOp) (uint64, error) {
	body, err := json.Marshal(struct {
		If  []wire.Cond  `json:"if,omitempty"` // not null: openapi.json's Txn has arrays
		Ops []wire.TxnOp `json:"ops,omitempty"`
	}{conds, ops})
	if err != nil {
		return 0, err
	}
	req, err := h.request(ctx, http.MethodPost, roomPath(room, "txn"), nil, body)
	if err != nil {
		return 0, err
	}
	return h.write(req, nil)
}

func (h *HTTP) write(req *http.Request, ifRev *uint64) (uint64, error) {
	if ifRev != nil {
		req.Header.Set("If-Match", strconv.FormatUint(*ifRev, 10))
	}
	var r struct {
		Rev uint64 `json:"rev"`
	}
	_, err := h.do(req, &r)
	return r.Rev, err
}

// GrantLease creates a TTL lease; keep it alive with KeepAlive within ttl.
func (h *HTTP) GrantLease(ctx context.Context, ttl time.Duration) (string, error) {
	body := fmt.Appendf(nil, `{"ttl_ms":%d}`, ttl.Milliseconds())
	req, err := h.request(ctx, http.MethodPost, "/v1/leases", nil, body)
	if err != nil {
		return "", err
	}
	var r struct {
		ID string `json:"id"`
	}
	if _, err := h.do(req, &r); err != nil {
		return "", err
	}
	return r.ID, nil
}

// KeepAlive renews a lease for its TTL; an ended lease is ErrNotFound.
func (h *HTTP) KeepAlive(ctx context.Context, id string) error {
	req, err := h.request(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/keepalive", nil, nil)
	if err != nil {
		return err
	}
	_, err = h.do(req, nil)
	return err
}

// Revoke ends a lease now, deleting its keys.
func (h *HTTP) Revoke(ctx context.Context, id string) error {
	req, err := h.request(ctx, http.MethodDelete, "/v1/leases/"+url.PathEscape(id), nil, nil)
	if err != nil {
		return err
	}
	_, err = h.do(req, nil)
	return err
}
