package benchtest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
)

// lateEOF stands for a loaded machine: the read that would find the end of
// the request body (the transport makes it after the declared length, to
// check for extra bytes) comes 100 ms late, by which time the backend has
// begun its answer.
type lateEOF struct{ r io.ReadCloser }

func (l lateEOF) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if n == 0 {
		time.Sleep(100 * time.Millisecond)
		return l.r.Read(p)
	}
	return n, err
}

func (l lateEOF) Close() error { return l.r.Close() }

// TestForwardStreamsWholeAnswerWhenTheBodyEndsLate: a stream forwarded by
// Forward arrives whole although the request body's end is read late. A
// plain httputil.ReverseProxy cuts it ("use of closed network connection":
// the server closed the body when the answer began, the transport's late
// read failed and closed the upstream connection), which once failed a
// bench warm-up in CI.
func TestForwardStreamsWholeAnswerWhenTheBodyEndsLate(t *testing.T) {
	sim := simtest.Start(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "m", PrefillTPS: 1e6, DecodeTPS: 200})
	u, err := url.Parse(sim)
	if err != nil {
		t.Fatal(err)
	}
	fwd := Forward(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = lateEOF{r.Body}
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	// 100 tokens at 200 tok/s: the answer is still streaming when the late
	// read would come.
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"ignore_eos":true,"stream":true}`
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || err != nil || !strings.Contains(string(got), "data: [DONE]") {
		t.Fatalf("status %d, %d bytes, read error %v, [DONE] seen %v: the stream was cut",
			resp.StatusCode, len(got), err, strings.Contains(string(got), "[DONE]"))
	}
}
