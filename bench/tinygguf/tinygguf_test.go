package tinygguf

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

func encode(t *testing.T, c Config) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Encode(&b, c); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDeterministic(t *testing.T) {
	a := sha256.Sum256(encode(t, Config{}))
	b := sha256.Sum256(encode(t, Config{}))
	if a != b {
		t.Fatal("two encodings of the same config differ")
	}
	c := sha256.Sum256(encode(t, Config{Seed: 2}))
	if a == c {
		t.Fatal("a different seed gave the same bytes")
	}
}

func TestHeaderReadsBack(t *testing.T) {
	data := encode(t, Config{})
	h, err := ReadHeader(data)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"general.architecture":          "llama",
		"llama.context_length":          uint32(8192),
		"llama.embedding_length":        uint32(64),
		"llama.block_count":             uint32(2),
		"llama.attention.head_count":    uint32(4),
		"llama.attention.head_count_kv": uint32(2),
		"llama.feed_forward_length":     uint32(128),
		"llama.rope.dimension_count":    uint32(16),
		"tokenizer.ggml.model":          "llama",
		"tokenizer.ggml.eos_token_id":   uint32(2),
		"tokenizer.ggml.add_bos_token":  true,
	} {
		if got := h.Metadata[key]; got != want {
			t.Errorf("%s = %v (%T), want %v", key, got, got, want)
		}
	}
	if toks, _ := h.Metadata["tokenizer.ggml.tokens"].([]any); len(toks) != 354 {
		t.Errorf("vocabulary has %d tokens, want 354", len(toks))
	}
	wantTensors := map[string][]uint64{
		"token_embd.weight":        {64, 354},
		"output.weight":            {64, 354},
		"output_norm.weight":       {64},
		"blk.0.attn_k.weight":      {64, 32},
		"blk.1.ffn_down.weight":    {128, 64},
		"blk.1.attn_output.weight": {64, 64},
	}
	for name, dims := range wantTensors {
		if got := h.Tensors[name]; !equal(got, dims) {
			t.Errorf("tensor %s dims %v, want %v", name, got, dims)
		}
	}
	if len(h.Tensors) != 3+2*9 {
		t.Errorf("%d tensors, want %d", len(h.Tensors), 3+2*9)
	}
	if h.DataOffset%32 != 0 {
		t.Errorf("data offset %d not aligned to 32", h.DataOffset)
	}
	// Data: every F32 tensor, each padded to 32 bytes.
	var size uint64
	for _, dims := range h.Tensors {
		n := uint64(4)
		for _, d := range dims {
			n *= d
		}
		size += align(n)
	}
	if got := uint64(len(data)); got != h.DataOffset+size {
		t.Errorf("file is %d bytes, header + tensors say %d", got, h.DataOffset+size)
	}
}

func TestShaping(t *testing.T) {
	c, _ := Config{}.withDefaults()
	ts := weights(c, len(Tokens()))
	byName := map[string]tensor{}
	for _, x := range ts {
		byName[x.name] = x
	}
	out := byName["output.weight"].data
	for tok := 0; tok < len(Tokens()); tok++ {
		w := out[tok*c.Dim]
		if tok < firstText && w != forbidden {
			t.Fatalf("token %d (%q) weight %v on the reserved dimension, want %v", tok, Tokens()[tok], w, float32(forbidden))
		}
		if tok >= firstText && w != 0 {
			t.Fatalf("text token %d weight %v on the reserved dimension, want 0", tok, w)
		}
	}
	for _, name := range []string{"blk.0.attn_output.weight", "blk.1.ffn_down.weight"} {
		x := byName[name]
		in := int(x.dims[0])
		for i := 0; i < in; i++ {
			if x.data[i] != 0 {
				t.Fatalf("%s writes the reserved dimension (row 0, col %d = %v)", name, i, x.data[i])
			}
		}
	}
}

func TestBadConfig(t *testing.T) {
	for _, c := range []Config{{Dim: 60, Heads: 7}, {Heads: 4, KVHeads: 3}, {Blocks: -1}, {ContextLen: 3}, {Dim: 12, Heads: 4}} {
		if err := Encode(&bytes.Buffer{}, c); err == nil {
			t.Errorf("config %+v: no error", c)
		}
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path, err := WriteFile(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, encode(t, Config{})) {
		t.Fatal("file differs from Encode's output")
	}
	if filepath.Base(path) != "tiny.gguf" {
		t.Fatalf("path %s", path)
	}
	if len(data) > 1<<20 {
		t.Fatalf("model is %d bytes, want under 1 MiB", len(data))
	}
}

func TestReadHeaderRejects(t *testing.T) {
	good := encode(t, Config{})
	for name, data := range map[string][]byte{
		"empty":     nil,
		"magic":     []byte("GGML...."),
		"version":   append([]byte("GGUF"), 2, 0, 0, 0),
		"truncated": good[:200],
		"huge count": append(append([]byte("GGUF"), 3, 0, 0, 0),
			0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0),
	} {
		if _, err := ReadHeader(data); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzReadHeader(f *testing.F) {
	var b bytes.Buffer
	_ = Encode(&b, Config{Blocks: 1, Dim: 8, Heads: 2, KVHeads: 1, FFDim: 8})
	f.Add(b.Bytes()[:2048])
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ReadHeader(data) // must not panic or allocate without bound
	})
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
