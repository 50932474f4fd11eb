package loopback

import "testing"

func TestIsHost(t *testing.T) {
	for _, tt := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.9.9.9", true},
		{"::1", true},
		{"[::1]", true},
		{"localhost", true},
		{"LOCALHOST", true},
		{"localhost.", true},
		{"app.localhost", true},
		{"", false},
		{"0.0.0.0", false}, // a wildcard is not a host anyone is reached at
		{"::", false},
		{"[::]", false},
		{"evil.example", false},
		{"127.0.0.1.nip.io", false},
		{"localhost.evil.example", false},
		{"10.0.0.1", false},
		{"::2", false},
	} {
		if got := IsHost(tt.host); got != tt.want {
			t.Errorf("IsHost(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestDialsLoopback(t *testing.T) {
	for _, tt := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.9.9.9", true},
		{"::1", true},
		{"::ffff:127.0.0.1", true},
		{"localhost", true},
		{"LOCALHOST", true},
		{"LocalHost", true},
		{"app.localhost", false}, // DNS may answer it with any address
		{"localhost.", false},
		{"[::1]", false}, // a host from url.Hostname or net.SplitHostPort has no brackets
		{"", false},
		{"0.0.0.0", false},
		{"::", false},
		{"evil.example", false},
		{"127.0.0.1.nip.io", false},
		{"localhost.evil.example", false},
		{"10.0.0.1", false},
	} {
		if got := DialsLoopback(tt.host); got != tt.want {
			t.Errorf("DialsLoopback(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestListensOnly(t *testing.T) {
	for _, tt := range []struct {
		listen string
		want   bool
	}{
		{"127.0.0.1:8080", true},
		{"[::1]:80", true},
		{"localhost:1", true},
		{"0.0.0.0:8080", false}, // binds every interface
		{":8080", false},
		{"[::]:8080", false},
		{"[0:0:0:0:0:0:0:0]:8080", false},
		{"192.168.1.5:80", false},
		{"garbage", false},
		{"127.0.0.1", false}, // no port: not a listen address
	} {
		if got := ListensOnly(tt.listen); got != tt.want {
			t.Errorf("ListensOnly(%q) = %v, want %v", tt.listen, got, tt.want)
		}
	}
}

func TestIsWildcard(t *testing.T) {
	for _, tt := range []struct {
		host string
		want bool
	}{
		{"", true},
		{"0.0.0.0", true},
		{"::", true},
		{"[::]", true},
		{"0:0:0:0:0:0:0:0", true},
		{"127.0.0.1", false},
		{"::1", false},
		{"localhost", false},
		{"gpu-box.lan", false},
	} {
		if got := IsWildcard(tt.host); got != tt.want {
			t.Errorf("IsWildcard(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestDialHost(t *testing.T) {
	for _, tt := range []struct{ host, want string }{
		{"", "127.0.0.1"},
		{"0.0.0.0", "127.0.0.1"},
		{"::", "127.0.0.1"},
		{"127.0.0.1", "127.0.0.1"},
		{"::1", "::1"},
		{"localhost", "localhost"},
		{"192.168.1.5", "192.168.1.5"},
	} {
		if got := DialHost(tt.host); got != tt.want {
			t.Errorf("DialHost(%q) = %q, want %q", tt.host, got, tt.want)
		}
	}
}
