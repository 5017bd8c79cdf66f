// Corpora already tokenized by another trainer, read for `yuanlm prep --format megatron|llmc` (docs/FORMAT.md):
// Megatron-LM's indexed dataset (PREFIX.idx + PREFIX.bin) and llm.c's token files. Each file is checked against
// its published layout before its tokens are used, and read in bounded memory (mapped, never copied whole).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace yuan {

enum class TokenFormat { Megatron, Llmc };

struct TokenSource {
  std::string path;   // megatron: PREFIX.bin; llmc: the file
  uint64_t bytes = 0;  // of `path`
  uint64_t docs = 0;   // filled in by import_tokens
};

// The files behind --input: for megatron each argument is a PREFIX (PREFIX.idx and PREFIX.bin must both exist);
// for llmc a file or glob. Checks the headers, so a file that is not what it claims fails before anything else.
std::vector<TokenSource> token_sources(TokenFormat format, const std::vector<std::string>& inputs);

// Receives tokens in input order: `doc_start` marks the first piece of a document. Pieces are at most a few MiB.
using TokenSink = std::function<void(const uint32_t* ids, size_t n, bool doc_start)>;

// Streams the documents of every source to `sink`, each beginning with `eot_id`: Megatron's documents get it
// prepended; llm.c's files already begin each document with it (tokens before a file's first eot_id form a
// document of their own, which gets it prepended). Every id is checked < vocab_size; any violation of the layout
// throws Error naming the file.
void import_tokens(TokenFormat format, std::vector<TokenSource>& sources, int vocab_size, uint32_t eot_id,
                   const TokenSink& sink);

}  // namespace yuan
