// What a warp collective computes once every lane of its mask has arrived (kernel.cpp gathers them), from the PTX
// ISA's definitions:
//   shfl.sync.{idx,up,down,bfly}: a source lane per lane, clamped to the lane's segment of `width` lanes (a source
//     outside it gives the lane its own value); a source lane outside the mask is inactive and gives an undefined
//     value, which is reported instead.
//   vote.sync.ballot: the predicates of the mask's lanes as bits.
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ("Matrix fragments for mma.m16n8k16 with floating point
//     type"): with group g = lane / 4 and t = lane % 4, a lane holds
//       A (16x16, 4 registers of 2 bf16, low half first): rows g, g+8, g, g+8 and columns 2t+{0,1}, 2t+{0,1},
//         8+2t+{0,1}, 8+2t+{0,1};
//       B (16x8, 2 registers): rows 2t+{0,1} and 8+2t+{0,1} of column g;
//       C and D (16x8 fp32): rows g, g, g+8, g+8 and columns 2t, 2t+1, 2t, 2t+1.
//     D = A B + C, each product exact in fp32 (bf16 products are), summed in k order, C added last. The tensor core's
//     own order and rounding of the sum are not modelled; results differ from a GPU by fp32 rounding.
//   ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: lanes 8i..8i+7 give the addresses of rows 0..7 of
//     matrix i (16 bytes each); lane l receives, of each matrix, row l/4's elements 2(l%4) and 2(l%4)+1 (low half
//     first), or with .trans, column l/4's elements of rows 2(l%4) and 2(l%4)+1.
#include <cstring>

#include "emulator.h"

namespace yuan::emu {
namespace {

float bf16_lo(uint32_t r) {
  const uint32_t u = r << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float bf16_hi(uint32_t r) {
  const uint32_t u = r & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void shuffle(LaneCall* const* lanes, unsigned mask) {
  for (int i = 0; i < 32; i++) {
    LaneCall* c = lanes[i];
    if (!c) continue;
    const int w = c->width;
    if (w < 1 || w > 32 || (w & (w - 1)) != 0)
      kernel_fault(Check::WarpDivergence, 0, format("shuffle width %d is not a power of two up to 32", w));
    const int first = i & ~(w - 1), last = first + w - 1;
    int src = i;
    switch (c->op) {
      case WarpOp::ShflIdx: src = first + (c->arg & (w - 1)); break;
      case WarpOp::ShflUp: src = i - c->arg >= first ? i - c->arg : i; break;
      case WarpOp::ShflDown: src = i + c->arg <= last ? i + c->arg : i; break;
      case WarpOp::ShflXor: src = (i ^ c->arg) <= last ? (i ^ c->arg) : i; break;
      default: break;
    }
    if (src < 0 || src > 31 || !(mask >> src & 1))
      kernel_fault(Check::WarpDivergence, 0,
                   format("lane %d of a shuffle (mask 0x%08x) reads lane %d, which is not in the mask: the value "
                          "is undefined",
                          i, mask, src));
    const uint64_t v = lanes[src]->value;
    c->out[0] = static_cast<uint32_t>(v);
    c->out[1] = static_cast<uint32_t>(v >> 32);
  }
}

void mma(LaneCall* const* lanes) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    const uint32_t* in = lanes[l]->in;
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) {
      const int row = g + (r % 2) * 8, col = 2 * t + (r / 2) * 8;
      A[row][col] = bf16_lo(in[r]);
      A[row][col + 1] = bf16_hi(in[r]);
    }
    for (int r = 0; r < 2; r++) {
      B[2 * t + r * 8][g] = bf16_lo(in[4 + r]);
      B[2 * t + r * 8 + 1][g] = bf16_hi(in[4 + r]);
    }
    for (int r = 0; r < 4; r++) C[g + (r / 2) * 8][2 * t + r % 2] = from_bits(in[6 + r]);
  }
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) {
      const int row = g + (r / 2) * 8, col = 2 * t + r % 2;
      float acc = 0;
      for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
      lanes[l]->out[r] = bits(acc + C[row][col]);
    }
  }
}

void ldmatrix(LaneCall* const* lanes, const std::function<void(const void*, int)>& read) {
  const int matrices = lanes[0]->matrices;
  const bool trans = lanes[0]->trans;
  for (int l = 1; l < 32; l++)
    if (lanes[l]->matrices != matrices || lanes[l]->trans != trans)
      kernel_fault(Check::WarpDivergence, 0, "the lanes of an ldmatrix disagree on its shape (.x1/.x2/.x4, .trans)");
  uint16_t m[4][8][8];
  for (int i = 0; i < matrices; i++)
    for (int r = 0; r < 8; r++) {
      const void* row = lanes[8 * i + r]->addr;
      if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
        kernel_fault(Check::Misaligned, reinterpret_cast<uintptr_t>(row),
                     format("ldmatrix row address %p of lane %d is not 16-byte aligned", row, 8 * i + r));
      read(row, 8 * i + r);
      std::memcpy(m[i][r], row, 16);
    }
  for (int l = 0; l < 32; l++)
    for (int i = 0; i < matrices; i++) {
      const int a = l / 4, b = 2 * (l % 4);
      const uint16_t lo = trans ? m[i][b][a] : m[i][a][b], hi = trans ? m[i][b + 1][a] : m[i][a][b + 1];
      lanes[l]->out[i] = lo | static_cast<uint32_t>(hi) << 16;
    }
}

}  // namespace

void complete_warp_op(LaneCall* const* lanes, unsigned mask, const std::function<void(const void*, int)>& read) {
  int first = 0;
  while (!lanes[first]) first++;
  switch (lanes[first]->op) {
    case WarpOp::ShflIdx: case WarpOp::ShflUp: case WarpOp::ShflDown: case WarpOp::ShflXor:
      shuffle(lanes, mask);
      return;
    case WarpOp::Ballot: case WarpOp::All: case WarpOp::Any: {
      unsigned ballot = 0;
      for (int i = 0; i < 32; i++)
        if (lanes[i] && lanes[i]->value) ballot |= 1u << i;
      for (int i = 0; i < 32; i++)
        if (lanes[i]) lanes[i]->out[0] = ballot;
      return;
    }
    case WarpOp::SyncWarp: return;
    case WarpOp::Mma: return mma(lanes);
    case WarpOp::Ldmatrix: return ldmatrix(lanes, read);
  }
}

}  // namespace yuan::emu
