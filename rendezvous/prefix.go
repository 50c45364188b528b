package rendezvous

import (
	"context"
	"strings"
)

// Prefix returns a view of s in which every key is stored as prefix + "/" +
// key (Gloo's PrefixStore), so that jobs, generations or backends sharing one
// store cannot see each other's keys. Views nest: Prefix(Prefix(s, "a"), "b")
// stores key k as "a/b/k". MaxKeyLen applies to the full key. An empty prefix
// returns s itself.
func Prefix(s Store, prefix string) Store {
	if prefix == "" {
		return s
	}
	return &prefixStore{s: s, prefix: prefix + "/"}
}

// prefixStore is the Store returned by Prefix.
type prefixStore struct {
	s      Store
	prefix string // ends in "/"
}

// full maps key into the view. An empty key stays invalid rather than naming
// the prefix itself.
func (p *prefixStore) full(key string) (string, error) {
	if key == "" {
		return "", checkKey(key)
	}
	return p.prefix + key, nil
}

func (p *prefixStore) Set(ctx context.Context, key string, value []byte) error {
	key, err := p.full(key)
	if err != nil {
		return err
	}
	return p.s.Set(ctx, key, value)
}

func (p *prefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	key, err := p.full(key)
	if err != nil {
		return nil, err
	}
	return p.s.Get(ctx, key)
}

func (p *prefixStore) Wait(ctx context.Context, keys ...string) (map[string][]byte, error) {
	full := make([]string, len(keys))
	for i, k := range keys {
		f, err := p.full(k)
		if err != nil {
			return nil, err
		}
		full[i] = f
	}
	m, err := p.s.Wait(ctx, full...)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[strings.TrimPrefix(k, p.prefix)] = v
	}
	return out, nil
}

func (p *prefixStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	key, err := p.full(key)
	if err != nil {
		return 0, err
	}
	return p.s.Add(ctx, key, delta)
}

func (p *prefixStore) Delete(ctx context.Context, key string) error {
	key, err := p.full(key)
	if err != nil {
		return err
	}
	return p.s.Delete(ctx, key)
}
