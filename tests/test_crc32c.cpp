// CRC-32C: the known check value, the crc32 instruction's three-stream path against the table on lengths and
// alignments around its block size, pieces fed one after another, the fused copy, and a file's checksum.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "util/crc32c.h"
#include "util/error.h"

namespace yuan {
namespace {

std::vector<unsigned char> bytes(size_t n) {
  std::vector<unsigned char> b(n);
  uint32_t x = 12345;
  for (unsigned char& c : b) c = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 23);
  return b;
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_table(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  const std::vector<unsigned char> zeros(32, 0);  // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
}

TEST(Crc32c, EveryPathAgreesWithTheTableInPiecesAndCopies) {
  const std::vector<unsigned char> b = bytes((size_t{3} << 15) * 2 + 1000);  // two of the streams' blocks and a tail
  for (size_t start : {0, 1, 3, 7})
    for (size_t n : {size_t{0}, size_t{5}, size_t{8}, size_t{3} << 15, (size_t{3} << 15) + 13, b.size() - 7}) {
      const uint32_t want = crc32c_table(0, b.data() + start, n);
      EXPECT_EQ(crc32c(0, b.data() + start, n), want) << start << " " << n;
      const size_t half = n / 2;
      EXPECT_EQ(crc32c(crc32c(0, b.data() + start, half), b.data() + start + half, n - half), want);
      // The copy's destination at every offset from a 32-byte boundary that its paths tell apart.
      std::vector<unsigned char> buf(n + 96, 0xAB);
      unsigned char* const line = buf.data() + (32 - reinterpret_cast<uintptr_t>(buf.data()) % 32) % 32;
      for (size_t off : {0, 1, 8, 24, 31}) {
        unsigned char* const dst = line + off + 1;  // a guard byte before it
        std::fill(buf.begin(), buf.end(), 0xAB);
        EXPECT_EQ(crc32c_copy(0, dst, b.data() + start, n), want) << start << " " << n << " " << off;
        EXPECT_TRUE(std::equal(b.begin() + start, b.begin() + start + n, dst)) << start << " " << n << " " << off;
        EXPECT_EQ(dst[-1], 0xAB);
        EXPECT_EQ(dst[n], 0xAB);
      }
    }
  std::printf("crc32c here: %s\n", crc32c_hardware() ? "the crc32 instruction" : "the table");
}

TEST(Crc32c, AFileAndOneChangedByteOfIt) {
  const std::string path = ::testing::TempDir() + "crc32c_test.bin";
  std::vector<unsigned char> b = bytes(size_t{5} << 20);  // more than the file reader's buffer
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
  EXPECT_EQ(crc32c_file(path), crc32c_hex(crc32c_table(0, b.data(), b.size())));
  b[12345] ^= 1;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
  EXPECT_EQ(crc32c_file(path), crc32c_hex(crc32c_table(0, b.data(), b.size())));
  std::remove(path.c_str());
  EXPECT_THROW(crc32c_file(path), Error);
}

}  // namespace
}  // namespace yuan
