// Byte-level BPE as GPT-2 made it and HuggingFace's `tokenizers` writes it: a tokenizer.json whose model is BPE
// behind a ByteLevel pre-tokenizer (alone, or after Split pre-tokenizers with their own patterns), or GPT-2's
// vocab.json + merges.txt pair (also under OpenAI's names encoder.json + vocab.bpe). Anything else in a
// tokenizer.json (another model, a normalizer, dropout, a subword prefix...) is refused, never approximated.
#pragma once
#include <memory>
#include <string>

#include "prep/tokenizer.h"

namespace yuan {

// A path load_bpe reads: *.json, or the merges half of a pair (merges.txt, vocab.bpe).
bool is_bpe_path(const std::string& path);

// The tokenizer.json text of `path`: the file itself, or for a vocab.json + merges.txt pair (either named) the
// one tokenizer.json it amounts to, which HF's `tokenizers` loads too. This is what prep stores beside the shards
// and what the tokenizer's name hashes, so one file carries the tokenizer into every checkpoint.
std::string bpe_tokenizer_json(const std::string& path);

// Named "bpe:sha256:<sha256 of bpe_tokenizer_json(path)>"; eot is <|endoftext|> when the vocabulary or the added
// tokens hold it, else a dedicated id = vocabulary size. encode gives HF's `encode(text)` ids; decode gives the
// bytes back, with what is not UTF-8 (ids cut inside a character) replaced by U+FFFD as HF's decode does.
std::unique_ptr<Tokenizer> load_bpe(const std::string& path);

}  // namespace yuan
