// CRC-32C (Castagnoli; the iSCSI, ext4 and SCR checksum): the fast checkpoint tier's per-file checksum. It detects
// the corruption and truncation a node-memory copy can suffer at a fraction of SHA-256's cost, which matters there
// because the tier rewrites the whole optimizer state every step. x86-64 CPUs with SSE4.2 and AVX2 run it on the
// crc32 instruction, three streams at once; other CPUs on a table.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace yuan {

// The CRC-32C of `crc`'s bytes followed by n bytes at `data` (crc32c(0, "123456789", 9) == 0xE3069283): start
// with 0 and feed the pieces in order.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

// Copies n bytes from src to dst (not overlapping) and returns crc32c(crc, src, n), reading src once: the bytes are
// checksummed while they are in registers. Made for copies of hundreds of MB: on x86-64, dst is written with
// non-temporal stores, which do not read its lines into the caches first and leave none of them there.
uint32_t crc32c_copy(uint32_t crc, void* dst, const void* src, size_t n);

std::string crc32c_hex(uint32_t crc);              // 8 lower-case hex digits
std::string crc32c_file(const std::string& path);  // crc32c_hex of the file's bytes; throws Error naming the file

// Whether crc32c runs on the crc32 instruction here (for the tests, which check it against the table).
bool crc32c_hardware();
// The table's result whatever the CPU has (for the tests).
uint32_t crc32c_table(uint32_t crc, const void* data, size_t n);

}  // namespace yuan
