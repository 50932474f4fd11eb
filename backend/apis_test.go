package backend

import "testing"

func TestRouterNotFound(t *testing.T) {
	for _, tc := range []struct {
		status int
		ct     string
		body   string
		want   bool
	}{
		{404, "text/plain; charset=utf-8", "404 page not found", true},
		{404, "application/json", `{"detail":"Not Found"}`, true},
		{405, "application/json", `{"detail":"Method Not Allowed"}`, true},
		{404, "application/json", `{"error":{"message":"model \"x\" not found"}}`, false},
		{404, "application/json", `{"detail":"model missing"}`, false},
		{400, "text/plain", "bad", false},
		{404, "application/json", "not json", false},
	} {
		if got := RouterNotFound(tc.status, tc.ct, []byte(tc.body)); got != tc.want {
			t.Errorf("RouterNotFound(%d, %q, %q) = %v", tc.status, tc.ct, tc.body, got)
		}
	}
}
