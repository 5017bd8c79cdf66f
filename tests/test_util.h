// Helpers shared by the test suites.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "util/error.h"

namespace yuan::testing {

// A fresh directory under /tmp for each test, removed when the test ends.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/yuanlm_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // Writes `text` to a file of the directory; returns its path.
  std::string file(const std::string& name, const std::string& text) const {
    std::string p = path(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  std::string dir_;
};

// The message of the yuan::Error that `f` throws ("" when it throws none); every error must be one line.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "error spans lines: " << e.what();
    return e.what();
  }
  return "";
}

// max|a - ref| / max|ref| over a whole tensor (single elements can be ~0, so the tensor's scale is the yardstick);
// NaN anywhere makes it infinite.
template <typename A, typename B>
double rel_err(const A* a, const B* ref, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(ref[i]));
    if (std::isnan(d)) return INFINITY;
    err = std::max(err, d);
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return scale > 0 ? err / scale : err;
}

}  // namespace yuan::testing
