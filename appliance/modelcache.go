package appliance

// Where a backend's server finds a model on disk, and whether it is all
// there. A fenced backend (PrivateNetwork=yes) cannot download: a model
// that is not complete in its user's cache fails the start, after the
// ready timeout at worst. These functions read only the file system, so
// the switch can refuse such a profile in milliseconds.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// errUndecidable marks a cache that could not be read (permissions, an
// unknown user): the check cannot tell, so it must not refuse a switch.
var errUndecidable = errors.New("cannot read the cache")

// cacheResult is what a cache lookup found: where it looked, what is
// missing (empty: complete), and a short summary of what is there.
type cacheResult struct {
	Path    string
	Missing []string
	Found   string
}

// statOK reports whether path exists (following symlinks, so a snapshot
// link to a blob still downloading counts as missing). A permission error
// is undecidable, not missing.
func statOK(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrPermission):
		return false, fmt.Errorf("%w: %v", errUndecidable, err)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("%w: %v", errUndecidable, err)
}

// hfHubDir is the Hugging Face hub cache for an environment and home, in
// huggingface_hub's order: HF_HUB_CACHE, HF_HOME/hub,
// XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub.
func hfHubDir(env map[string]string, home string) string {
	switch {
	case env["HF_HUB_CACHE"] != "":
		return env["HF_HUB_CACHE"]
	case env["HF_HOME"] != "":
		return filepath.Join(env["HF_HOME"], "hub")
	case env["XDG_CACHE_HOME"] != "":
		return filepath.Join(env["XDG_CACHE_HOME"], "huggingface", "hub")
	}
	return filepath.Join(home, ".cache", "huggingface", "hub")
}

// tokenizerFiles are the files of which a model needs one to tokenize:
// fast (tokenizer.json), SentencePiece, BPE and WordPiece vocabularies,
// Mistral's tekken, tiktoken (also any *.tiktoken).
var tokenizerFiles = []string{"tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
	"sentencepiece.bpe.model", "tekken.json", "tiktoken.model"}

// isTokenizer reports whether a file name is one of tokenizerFiles.
func isTokenizer(name string) bool {
	return slices.Contains(tokenizerFiles, name) || strings.HasSuffix(name, ".tiktoken")
}

// hfModel checks that model (a repo id, or an absolute folder) at revision
// (a branch or tag under refs/, or a commit; "" = main) is complete in the
// hub cache hub: a snapshot with config.json, a tokenizer and the weights
// (every shard the index names, or a single *.safetensors / *.bin).
func hfModel(hub, model, revision string) (cacheResult, error) {
	if filepath.IsAbs(model) {
		return snapshotFiles(model, cacheResult{Path: model})
	}
	if revision == "" {
		revision = "main"
	}
	repo := filepath.Join(hub, "models--"+strings.ReplaceAll(model, "/", "--"))
	res := cacheResult{Path: repo}
	if ok, err := statOK(repo); err != nil || !ok {
		res.Missing = append(res.Missing, "the repository folder")
		return res, err
	}
	commit := revision
	if ref, err := os.ReadFile(filepath.Join(repo, "refs", revision)); err == nil {
		commit = strings.TrimSpace(string(ref))
	} else if errors.Is(err, fs.ErrPermission) {
		return res, fmt.Errorf("%w: %v", errUndecidable, err)
	}
	snap := filepath.Join(repo, "snapshots", commit)
	res.Path = snap
	if ok, err := statOK(snap); err != nil || !ok {
		res.Missing = append(res.Missing, "refs/"+revision+" and its snapshot")
		return res, err
	}
	return snapshotFiles(snap, res)
}

// snapshotFiles checks the files of a model folder.
func snapshotFiles(dir string, res cacheResult) (cacheResult, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			res.Missing = append(res.Missing, "the model folder")
			return res, nil
		}
		return res, fmt.Errorf("%w: %v", errUndecidable, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	has := func(n string) bool {
		ok, _ := statOK(filepath.Join(dir, n))
		return slices.Contains(names, n) && ok
	}
	if !has("config.json") {
		res.Missing = append(res.Missing, "config.json")
	}
	if !slices.ContainsFunc(names, func(n string) bool { return isTokenizer(n) && has(n) }) {
		res.Missing = append(res.Missing, "a tokenizer ("+strings.Join(tokenizerFiles, ", ")+", *.tiktoken)")
	}
	weights, missing, err := weightFiles(dir, names, has)
	res.Missing = append(res.Missing, missing...)
	res.Found = fmt.Sprintf("config, tokenizer, %d weight file(s)", weights)
	return res, err
}

// weightFiles counts the weight files of a model folder and lists the
// missing ones: the shards a *.index.json names, else single files.
func weightFiles(dir string, names []string, has func(string) bool) (int, []string, error) {
	for _, idx := range []string{"model.safetensors.index.json", "pytorch_model.bin.index.json"} {
		if !has(idx) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, idx))
		if err != nil {
			return 0, nil, fmt.Errorf("%w: %v", errUndecidable, err)
		}
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &index); err != nil || len(index.WeightMap) == 0 {
			return 0, []string{idx + " (unreadable or empty: " + errText(err) + ")"}, nil
		}
		var shards, missing []string
		for _, f := range index.WeightMap {
			if !slices.Contains(shards, f) {
				shards = append(shards, f)
			}
		}
		slices.Sort(shards)
		for _, f := range shards {
			if !has(f) {
				missing = append(missing, f)
			}
		}
		return len(shards) - len(missing), missing, nil
	}
	n := 0
	for _, f := range names {
		if (strings.HasSuffix(f, ".safetensors") || strings.HasPrefix(f, "pytorch_model") && strings.HasSuffix(f, ".bin")) && has(f) {
			n++
		}
	}
	if n == 0 {
		return 0, []string{"weights (*.safetensors)"}, nil
	}
	return n, nil, nil
}

// ollamaModelsDir is Ollama's model store: OLLAMA_MODELS, else
// ~/.ollama/models.
func ollamaModelsDir(env map[string]string, home string) string {
	if d := env["OLLAMA_MODELS"]; d != "" {
		return d
	}
	return filepath.Join(home, ".ollama", "models")
}

// ollamaManifestPath is where Ollama keeps the manifest of name
// ([host/][namespace/]model[:tag], defaults registry.ollama.ai, library,
// latest) below the store.
func ollamaManifestPath(store, name string) string {
	base, tag := name, "latest"
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		base, tag = name[:i], name[i+1:]
	}
	parts := strings.Split(base, "/")
	switch len(parts) {
	case 1:
		parts = []string{"registry.ollama.ai", "library", parts[0]}
	case 2:
		parts = []string{"registry.ollama.ai", parts[0], parts[1]}
	}
	return filepath.Join(append([]string{store, "manifests"}, append(parts, tag)...)...)
}

// ollamaModel checks that name's manifest is in store and that every blob
// it names (config and layers) is there with its size.
func ollamaModel(store, name string) (cacheResult, error) {
	path := ollamaManifestPath(store, name)
	res := cacheResult{Path: path}
	raw, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		res.Missing = append(res.Missing, "the manifest")
		return res, nil
	case err != nil:
		return res, fmt.Errorf("%w: %v", errUndecidable, err)
	}
	type blob struct {
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	}
	var m struct {
		Config blob   `json:"config"`
		Layers []blob `json:"layers"`
	}
	if err := json.Unmarshal(raw, &m); err != nil || len(m.Layers) == 0 {
		res.Missing = append(res.Missing, "a readable manifest with layers ("+errText(err)+")")
		return res, nil
	}
	var total int64
	for _, b := range append([]blob{m.Config}, m.Layers...) {
		if b.Digest == "" {
			continue
		}
		p := filepath.Join(store, "blobs", strings.Replace(b.Digest, ":", "-", 1))
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrPermission):
			return res, fmt.Errorf("%w: %v", errUndecidable, err)
		case err != nil:
			res.Missing = append(res.Missing, "blob "+b.Digest)
		case b.Size > 0 && fi.Size() != b.Size:
			res.Missing = append(res.Missing, fmt.Sprintf("blob %s (%d of %d bytes)", b.Digest, fi.Size(), b.Size))
		default:
			total += fi.Size()
		}
	}
	res.Found = fmt.Sprintf("manifest and %d blob(s), %.1f MiB", len(m.Layers)+1, float64(total)/(1<<20))
	return res, nil
}
