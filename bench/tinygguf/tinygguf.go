// Package tinygguf writes a tiny llama-architecture model in GGUF v3, so
// that integration tests can run a real Ollama (or llama.cpp) without
// downloading weights. The model is nonsense but well-formed and
// deterministic: the same Config gives the same bytes.
//
// Its one useful property is shaping: every token embedding carries a
// constant on one reserved dimension that no layer reads or writes, and
// output.weight gives the control tokens (<unk>, <s>, </s>) and the byte
// tokens a large negative weight on it. Generation therefore always yields
// printable ASCII and never end-of-sequence, so a request produces exactly
// num_predict (or max_tokens) tokens. Always cap generation: uncapped, the
// model talks until the server's own limit.
package tinygguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"

	"gpuhost/internal/atomicfile"
)

// Config sizes the model. The zero value of a field takes the default.
type Config struct {
	Blocks      int    // transformer blocks; default 2
	Dim         int    // embedding width; default 64
	Heads       int    // attention heads; default 4
	KVHeads     int    // key/value heads; default 2
	FFDim       int    // feed-forward width; default 128
	ContextLen  int    // llama.context_length; default 8192
	Seed        uint64 // weight seed; default 1
	Name        string // general.name; default "gpuhost-tiny"
	RMSEpsilon  float32
	RopeFreqBas float32
}

func (c Config) withDefaults() (Config, error) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Blocks, 2)
	def(&c.Dim, 64)
	def(&c.Heads, 4)
	def(&c.KVHeads, 2)
	def(&c.FFDim, 128)
	def(&c.ContextLen, 8192)
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Name == "" {
		c.Name = "gpuhost-tiny"
	}
	if c.RMSEpsilon == 0 {
		c.RMSEpsilon = 1e-5
	}
	if c.RopeFreqBas == 0 {
		c.RopeFreqBas = 10000
	}
	switch {
	case c.Blocks < 1 || c.Blocks > 64:
		return c, fmt.Errorf("tiny gguf: blocks %d: want 1 to 64", c.Blocks)
	case c.Dim < 8 || c.Dim > 4096:
		return c, fmt.Errorf("tiny gguf: dim %d: want 8 to 4096", c.Dim)
	case c.Heads < 1 || c.Dim%c.Heads != 0:
		return c, fmt.Errorf("tiny gguf: %d heads must divide dim %d", c.Heads, c.Dim)
	case (c.Dim/c.Heads)%2 != 0:
		return c, fmt.Errorf("tiny gguf: head dim %d must be even (rope)", c.Dim/c.Heads)
	case c.KVHeads < 1 || c.Heads%c.KVHeads != 0:
		return c, fmt.Errorf("tiny gguf: %d KV heads must divide %d heads", c.KVHeads, c.Heads)
	case c.FFDim < 1 || c.FFDim > 65536:
		return c, fmt.Errorf("tiny gguf: feed-forward dim %d: want 1 to 65536", c.FFDim)
	case c.ContextLen < 16 || c.ContextLen > 1<<20:
		return c, fmt.Errorf("tiny gguf: context length %d: want 16 to %d", c.ContextLen, 1<<20)
	}
	return c, nil
}

// Tokens is the vocabulary: <unk>, <s>, </s>, the 256 byte tokens, "▁"
// (the SentencePiece space) and printable ASCII without the space — 354
// tokens, enough for a SentencePiece ("llama") tokenizer to encode any
// text.
func Tokens() []string {
	toks := []string{"<unk>", "<s>", "</s>"}
	for b := 0; b < 256; b++ {
		toks = append(toks, fmt.Sprintf("<0x%02X>", b))
	}
	toks = append(toks, "\u2581")
	for c := byte('!'); c <= '~'; c++ {
		toks = append(toks, string(c))
	}
	return toks
}

// Token types of the llama tokenizer (llama.cpp's llama_token_type).
const (
	tokNormal  = 1
	tokUnknown = 2
	tokControl = 3
	tokByte    = 6
)

// firstText is the id of "▁", the first token the model may generate.
const firstText = 3 + 256

// forbidden is the output weight, on the reserved dimension, of the tokens
// that must never be generated. The normalised reserved dimension is about
// 1/rms of the residual stream, so the weight must beat every other logit
// by a wide margin whatever the model's width: −10⁴ leaves them at
// probability e^−1000 and below.
const forbidden = -1e4

// GGUF value types.
const (
	ggufUint32  = 4
	ggufInt32   = 5
	ggufFloat32 = 6
	ggufBool    = 7
	ggufString  = 8
	ggufArray   = 9
)

const (
	ggufVersion   = 3
	ggufAlignment = 32
	ggmlTypeF32   = 0
)

type kv struct {
	key string
	val any // uint32, int32, float32, bool, string, []string, []float32, []int32
}

type tensor struct {
	name string
	dims []uint64 // ggml order: dims[0] is the fastest-moving
	data []float32
}

// Write writes the model to path atomically (temp file, fsync, rename).
func Write(path string, c Config) error {
	var buf bytes.Buffer
	if err := Encode(&buf, c); err != nil {
		return err
	}
	if err := atomicfile.Write(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write tiny gguf model: %w", err)
	}
	return nil
}

// Encode writes the model in GGUF v3 to w.
func Encode(w io.Writer, c Config) error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	toks := Tokens()
	scores := make([]float32, len(toks))
	types := make([]int32, len(toks))
	for i := range toks {
		switch {
		case i == 0:
			types[i] = tokUnknown
		case i < 3:
			types[i] = tokControl
		case i < firstText:
			types[i] = tokByte
		default:
			types[i] = tokNormal
			scores[i] = -float32(i) // no merges exist; a stable order
		}
	}
	headDim := c.Dim / c.Heads
	kvs := []kv{
		{"general.architecture", "llama"},
		{"general.name", c.Name},
		{"general.alignment", uint32(ggufAlignment)},
		{"llama.context_length", uint32(c.ContextLen)},
		{"llama.embedding_length", uint32(c.Dim)},
		{"llama.block_count", uint32(c.Blocks)},
		{"llama.feed_forward_length", uint32(c.FFDim)},
		{"llama.attention.head_count", uint32(c.Heads)},
		{"llama.attention.head_count_kv", uint32(c.KVHeads)},
		{"llama.attention.layer_norm_rms_epsilon", c.RMSEpsilon},
		{"llama.rope.dimension_count", uint32(headDim)},
		{"llama.rope.freq_base", c.RopeFreqBas},
		{"llama.vocab_size", uint32(len(toks))},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", toks},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(2)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
	}
	tensors := weights(c, len(toks))

	bw := bufio.NewWriter(w)
	e := &encoder{w: bw}
	e.raw([]byte("GGUF"))
	e.u32(ggufVersion)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, p := range kvs {
		e.str(p.key)
		e.value(p.val)
	}
	var offset uint64
	for _, t := range tensors {
		e.str(t.name)
		e.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			e.u64(d)
		}
		e.u32(ggmlTypeF32)
		e.u64(offset)
		offset = align(offset + uint64(len(t.data))*4)
	}
	e.pad()
	for _, t := range tensors {
		for _, f := range t.data {
			e.u32(math.Float32bits(f))
		}
		e.pad()
	}
	if e.err != nil {
		return fmt.Errorf("encode tiny gguf: %w", e.err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("encode tiny gguf: %w", err)
	}
	return nil
}

func align(n uint64) uint64 { return (n + ggufAlignment - 1) / ggufAlignment * ggufAlignment }

// weights builds every tensor. Dimension 0 of the embedding is the
// reserved one: constant 1 in every token, zero in every weight that reads
// from or writes to the residual stream, and forbidden (−10⁴) in output.weight for the
// tokens that must never be generated.
func weights(c Config, vocab int) []tensor {
	r := rand.New(rand.NewPCG(c.Seed, 0x9e3779b97f4a7c15))
	const reserved = 0
	rnd := func(n int, scale float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = (r.Float32()*2 - 1) * scale
		}
		return v
	}
	ones := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1
		}
		return v
	}
	// matrix is ggml [in, out]: row o (out) holds in values.
	matrix := func(in, out int, scale float32) []float32 {
		m := rnd(in*out, scale)
		for o := 0; o < out; o++ {
			m[o*in+reserved] = 0 // never read the reserved dimension
		}
		return m
	}
	// toResidual zeroes the rows that write the reserved dimension.
	toResidual := func(m []float32, in int) []float32 {
		for i := 0; i < in; i++ {
			m[reserved*in+i] = 0
		}
		return m
	}
	kvDim := c.Dim / c.Heads * c.KVHeads
	d, ff := uint64(c.Dim), uint64(c.FFDim)

	embd := rnd(vocab*c.Dim, 0.5)
	for t := 0; t < vocab; t++ {
		embd[t*c.Dim+reserved] = 1
	}
	out := rnd(vocab*c.Dim, 0.5)
	for t := 0; t < vocab; t++ {
		w := float32(0)
		if t < firstText {
			w = forbidden
		}
		out[t*c.Dim+reserved] = w
	}
	ts := []tensor{
		{"token_embd.weight", []uint64{d, uint64(vocab)}, embd},
		{"output_norm.weight", []uint64{d}, ones(c.Dim)},
		{"output.weight", []uint64{d, uint64(vocab)}, out},
	}
	for b := 0; b < c.Blocks; b++ {
		p := fmt.Sprintf("blk.%d.", b)
		ts = append(ts,
			tensor{p + "attn_norm.weight", []uint64{d}, ones(c.Dim)},
			tensor{p + "attn_q.weight", []uint64{d, d}, matrix(c.Dim, c.Dim, 0.3)},
			tensor{p + "attn_k.weight", []uint64{d, uint64(kvDim)}, matrix(c.Dim, kvDim, 0.3)},
			tensor{p + "attn_v.weight", []uint64{d, uint64(kvDim)}, matrix(c.Dim, kvDim, 0.3)},
			tensor{p + "attn_output.weight", []uint64{d, d}, toResidual(matrix(c.Dim, c.Dim, 0.3), c.Dim)},
			tensor{p + "ffn_norm.weight", []uint64{d}, ones(c.Dim)},
			tensor{p + "ffn_gate.weight", []uint64{d, ff}, matrix(c.Dim, c.FFDim, 0.3)},
			tensor{p + "ffn_up.weight", []uint64{d, ff}, matrix(c.Dim, c.FFDim, 0.3)},
			tensor{p + "ffn_down.weight", []uint64{ff, d}, toResidual(rnd(c.FFDim*c.Dim, 0.3), c.FFDim)},
		)
	}
	return ts
}

// encoder writes little-endian GGUF fields, keeping the first error.
type encoder struct {
	w   *bufio.Writer
	n   uint64
	err error
	b   [8]byte
}

func (e *encoder) raw(p []byte) {
	if e.err != nil {
		return
	}
	_, e.err = e.w.Write(p)
	e.n += uint64(len(p))
}

func (e *encoder) u32(v uint32) { binary.LittleEndian.PutUint32(e.b[:4], v); e.raw(e.b[:4]) }
func (e *encoder) u64(v uint64) { binary.LittleEndian.PutUint64(e.b[:8], v); e.raw(e.b[:8]) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.raw([]byte(s)) }

func (e *encoder) pad() {
	if rem := e.n % ggufAlignment; rem != 0 {
		e.raw(make([]byte, ggufAlignment-rem))
	}
}

func (e *encoder) value(v any) {
	switch t := v.(type) {
	case uint32:
		e.u32(ggufUint32)
		e.u32(t)
	case int32:
		e.u32(ggufInt32)
		e.u32(uint32(t))
	case float32:
		e.u32(ggufFloat32)
		e.u32(math.Float32bits(t))
	case bool:
		e.u32(ggufBool)
		if t {
			e.raw([]byte{1})
		} else {
			e.raw([]byte{0})
		}
	case string:
		e.u32(ggufString)
		e.str(t)
	case []string:
		e.u32(ggufArray)
		e.u32(ggufString)
		e.u64(uint64(len(t)))
		for _, s := range t {
			e.str(s)
		}
	case []float32:
		e.u32(ggufArray)
		e.u32(ggufFloat32)
		e.u64(uint64(len(t)))
		for _, f := range t {
			e.u32(math.Float32bits(f))
		}
	case []int32:
		e.u32(ggufArray)
		e.u32(ggufInt32)
		e.u64(uint64(len(t)))
		for _, i := range t {
			e.u32(uint32(i))
		}
	default:
		if e.err == nil {
			e.err = fmt.Errorf("unsupported metadata type %T", v)
		}
	}
}

// ErrNotGGUF is returned by ReadHeader for data that is not GGUF v3.
var ErrNotGGUF = errors.New("not a GGUF v3 file")

// Header is what ReadHeader reads back: the metadata and tensor table,
// which the tests use to check the file is well-formed.
type Header struct {
	Version  uint32
	Metadata map[string]any
	Tensors  map[string][]uint64
	// DataOffset is where the (aligned) tensor data starts.
	DataOffset uint64
}

// ReadHeader parses a GGUF v3 header from data, bounding every count by
// the data's size so that a corrupt or hostile file cannot make it
// allocate without limit.
func ReadHeader(data []byte) (*Header, error) {
	d := &decoder{b: data}
	if string(d.raw(4)) != "GGUF" {
		return nil, ErrNotGGUF
	}
	h := &Header{Version: d.u32(), Metadata: map[string]any{}, Tensors: map[string][]uint64{}}
	if d.err == nil && h.Version != ggufVersion {
		return nil, fmt.Errorf("%w: version %d", ErrNotGGUF, h.Version)
	}
	nt, nkv := d.count(24), d.count(13)
	for i := uint64(0); i < nkv && d.err == nil; i++ {
		k := d.str()
		h.Metadata[k] = d.value(d.u32(), 0)
	}
	for i := uint64(0); i < nt && d.err == nil; i++ {
		name := d.str()
		nd := d.u32()
		if nd > 4 {
			d.fail("tensor %q has %d dimensions", name, nd)
			break
		}
		dims := make([]uint64, nd)
		for j := range dims {
			dims[j] = d.u64()
		}
		_ = d.u32() // type
		_ = d.u64() // offset
		h.Tensors[name] = dims
	}
	if d.err != nil {
		return nil, fmt.Errorf("read gguf header: %w", d.err)
	}
	align := uint64(ggufAlignment)
	if a, ok := h.Metadata["general.alignment"].(uint32); ok && a > 0 {
		align = uint64(a)
	}
	h.DataOffset = (d.off + align - 1) / align * align
	return h, nil
}

type decoder struct {
	b   []byte
	off uint64
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("at byte %d: "+format, append([]any{d.off}, args...)...)
	}
}

func (d *decoder) raw(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b))-d.off {
		d.fail("need %d bytes, %d left", n, uint64(len(d.b))-d.off)
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u32() uint32 {
	p := d.raw(4)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

func (d *decoder) u64() uint64 {
	p := d.raw(8)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}

// count reads a count whose items take at least minSize bytes each, and
// rejects one the remaining data cannot hold.
func (d *decoder) count(minSize uint64) uint64 {
	n := d.u64()
	if d.err == nil && n > (uint64(len(d.b))-d.off)/minSize {
		d.fail("count %d exceeds the file", n)
		return 0
	}
	return n
}

func (d *decoder) str() string { return string(d.raw(d.count(1))) }

func (d *decoder) value(typ uint32, depth int) any {
	switch typ {
	case 0, 1:
		p := d.raw(1)
		if p == nil {
			return nil
		}
		return p[0]
	case 2, 3:
		p := d.raw(2)
		if p == nil {
			return nil
		}
		return binary.LittleEndian.Uint16(p)
	case ggufUint32:
		return d.u32()
	case ggufInt32:
		return int32(d.u32())
	case ggufFloat32:
		return math.Float32frombits(d.u32())
	case ggufBool:
		p := d.raw(1)
		return p != nil && p[0] != 0
	case ggufString:
		return d.str()
	case ggufArray:
		if depth > 2 {
			d.fail("arrays nested too deep")
			return nil
		}
		et := d.u32()
		n := d.count(1)
		out := make([]any, 0, min(n, 1<<16))
		for i := uint64(0); i < n && d.err == nil; i++ {
			out = append(out, d.value(et, depth+1))
		}
		return out
	case 10, 11, 12:
		return d.u64()
	default:
		d.fail("unknown value type %d", typ)
		return nil
	}
}

// WriteFile is Write for callers that want the path of a fresh model in a
// directory: it writes dir/tiny.gguf and returns the path.
func WriteFile(dir string, c Config) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("tiny gguf: create %s: %w", dir, err)
	}
	path := dir + string(os.PathSeparator) + "tiny.gguf"
	return path, Write(path, c)
}
