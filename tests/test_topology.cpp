// The parallel layout as arithmetic (layout/topology.h) and the per-stage step schedules (layout/schedule.h).
// The MPI groups made from a topology are tested under mpirun in test_mpi_groups.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "layout/schedule.h"
#include "layout/topology.h"
#include "test_util.h"

namespace yuan::layout {
namespace {

constexpr int kModules = 8;  // wte, wpe, h.0 .. h.4, ln_f

TEST(Topology, DataParallelIsOnePipelinePerRankHoldingEverything) {
  const Topology t = Topology::data_parallel(4, kModules, 3);
  EXPECT_EQ(t.world_size(), 4);
  for (int r = 0; r < 4; r++) {
    EXPECT_EQ(t.place(r).pipeline, r);
    EXPECT_EQ(t.place(r).stage, 0);
    EXPECT_EQ(t.stage_modules(r), (ModuleRange{0, kModules}));
    EXPECT_EQ(t.pipeline_ranks(r), std::vector<int>{r});
    EXPECT_EQ(t.tensor_ranks(r), std::vector<int>{r});
  }
  EXPECT_EQ(t.module_groups(), std::vector<ModuleRange>{(ModuleRange{0, kModules})});
  EXPECT_EQ(t.holders(5, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.pipelines()[2].micro_batches, 3);
}

// A 1-stage and a 2-stage pipeline side by side (world 3), and the same with tensor parallelism 2 (world 6).
TEST(Topology, HeterogeneousPipelinesShareEachModuleWithEveryHolder) {
  const std::vector<Pipeline> pipes = {{"one", {{0, kModules}}, 2}, {"two", {{0, 4}, {4, kModules}}, 4}};
  const Topology t(pipes, 1, kModules);
  ASSERT_EQ(t.world_size(), 3);
  EXPECT_EQ(t.rank_of({1, 1, 0}), 2);
  EXPECT_EQ(t.pipeline_ranks(1), (std::vector<int>{1, 2}));
  EXPECT_EQ(t.pipeline_ranks(0), std::vector<int>{0});
  EXPECT_EQ(t.stages_of(2), 2);
  // wte is also held by the last stage of "two", for its tied classifier: a group of its own.
  EXPECT_EQ(t.module_groups(), (std::vector<ModuleRange>{{0, 1}, {1, 4}, {4, kModules}}));
  EXPECT_EQ(t.holders(0, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(t.holders(1, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.holders(6, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(t.module_groups_of(0), (std::vector<ModuleRange>{{0, 1}, {1, 4}, {4, kModules}}));
  EXPECT_EQ(t.module_groups_of(2), (std::vector<ModuleRange>{{0, 1}, {4, kModules}}));
  EXPECT_TRUE(t.holds(2, 0));
  EXPECT_FALSE(t.holds(2, 1));

  const Topology tp(pipes, 2, kModules);
  ASSERT_EQ(tp.world_size(), 6);
  EXPECT_EQ(tp.place(3).pipeline, 1);
  EXPECT_EQ(tp.place(3).stage, 0);
  EXPECT_EQ(tp.place(3).tp_rank, 1);
  EXPECT_EQ(tp.tensor_ranks(4), (std::vector<int>{4, 5}));
  EXPECT_EQ(tp.pipeline_ranks(3), (std::vector<int>{3, 5}));
  EXPECT_EQ(tp.holders(6, 1), (std::vector<int>{1, 5}));
}

// Pipelines that cut at different places: module groups end at every cut of any pipeline.
TEST(Topology, ModuleGroupsEndAtEveryCut) {
  const Topology t({{"a", {{0, 3}, {3, kModules}}, 1}, {"b", {{0, 5}, {5, kModules}}, 1}}, 1, kModules);
  EXPECT_EQ(t.module_groups(), (std::vector<ModuleRange>{{0, 1}, {1, 3}, {3, 5}, {5, kModules}}));
  EXPECT_EQ(t.module_groups_of(2), (std::vector<ModuleRange>{{0, 1}, {1, 3}, {3, 5}}));  // pipeline b, stage 0
  EXPECT_EQ(t.holders(0, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.holders(4, 0), (std::vector<int>{1, 2}));
}

TEST(Topology, StagesMustTileTheModulesInOrder) {
  auto bad = [](std::vector<ModuleRange> stages, int tp = 1) {
    return testing::error_of([&] { Topology({{"x", stages, 1}}, tp, kModules); });
  };
  EXPECT_EQ(bad({{0, kModules}}), "");
  EXPECT_NE(bad({{0, 3}, {4, kModules}}), "");
  EXPECT_NE(bad({{0, 3}, {3, 3}, {3, kModules}}), "");
  EXPECT_NE(bad({{0, 3}}), "");
  EXPECT_NE(bad({{0, kModules}}, 0), "");
  EXPECT_NE(testing::error_of([] { Topology::data_parallel(2, kModules, 1).place(2); }), "");
}

// Every micro-batch runs forward once, then backward once; no two micro-batches in flight share a slot, and at
// most slots() are in flight.
void check_schedule(ScheduleKind kind, int stage, int stages, int m) {
  SCOPED_TRACE(::testing::Message() << schedule_name(kind) << " stage " << stage << " of " << stages << ", " << m
                                    << " micro-batches");
  const Schedule s(kind, stage, stages, m);
  std::vector<int> fwd(m, -1), bwd(m, -1), slot_of(m, -1);
  std::vector<int> owner(s.slots(), -1);
  int in_flight = 0, most = 0;
  for (size_t i = 0; i < s.actions().size(); i++) {
    const PipeAction& a = s.actions()[i];
    ASSERT_TRUE(a.micro >= 0 && a.micro < m && a.slot >= 0 && a.slot < s.slots());
    if (a.kind == PipeAction::Forward) {
      ASSERT_EQ(fwd[a.micro], -1) << "second forward of " << a.micro;
      ASSERT_EQ(owner[a.slot], -1) << "slot " << a.slot << " still holds micro-batch " << owner[a.slot];
      fwd[a.micro] = static_cast<int>(i), owner[a.slot] = a.micro, slot_of[a.micro] = a.slot;
      most = std::max(most, ++in_flight);
    } else {
      ASSERT_NE(fwd[a.micro], -1) << "backward of " << a.micro << " before its forward";
      ASSERT_EQ(bwd[a.micro], -1) << "second backward of " << a.micro;
      ASSERT_EQ(slot_of[a.micro], a.slot);
      bwd[a.micro] = static_cast<int>(i), owner[a.slot] = -1, in_flight--;
    }
  }
  EXPECT_EQ(s.actions().size(), static_cast<size_t>(2 * m));
  EXPECT_EQ(most, s.slots());
  // Backwards in forward order, as the stage after this one sends their gradients.
  for (int k = 1; k < m; k++) EXPECT_LT(bwd[k - 1], bwd[k]);
}

TEST(Schedule, EveryMicroBatchOnceInOrderWithinItsSlots) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int stages = 1; stages <= 4; stages++)
      for (int stage = 0; stage < stages; stage++)
        for (int m = 1; m <= 6; m++) check_schedule(kind, stage, stages, m);
}

TEST(Schedule, OneFOneBWarmsUpByTheStagesBelowAndKeepsAtMostThatManyInFlight) {
  const Schedule first(ScheduleKind::OneFOneB, 0, 4, 8), last(ScheduleKind::OneFOneB, 3, 4, 8);
  EXPECT_EQ(first.slots(), 4);
  EXPECT_EQ(last.slots(), 1);
  for (int i = 0; i < 3; i++) EXPECT_EQ(first.actions()[i].kind, PipeAction::Forward);
  EXPECT_EQ(first.actions()[4].kind, PipeAction::Backward);
  EXPECT_EQ(last.actions()[0].kind, PipeAction::Forward);
  EXPECT_EQ(last.actions()[1].kind, PipeAction::Backward);
  EXPECT_EQ(Schedule(ScheduleKind::GPipe, 3, 4, 8).slots(), 8);
  EXPECT_NE(testing::error_of([] { Schedule(ScheduleKind::GPipe, 2, 2, 1); }), "");
}

}  // namespace
}  // namespace yuan::layout
