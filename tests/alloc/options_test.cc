// ParseAllocConf / ValidateOptions: PYTORCH_CUDA_ALLOC_CONF syntax, per-backend keys, ranges
// (docs/interfaces.md, 'Allocator traces'; docs/allocator-rules.md, 'Options').
#include <catch2/catch.hpp>

#include "alloc/allocator.h"
#include "core/error.h"

namespace memsim::alloc {
namespace {

TEST_CASE("ParseAllocConf: values and defaults", "[alloc]") {
  const AllocatorOptions d = ParseAllocConf("", Backend::kCuda);
  CHECK_FALSE(d.max_split_size_bytes.has_value());
  CHECK(d.max_non_split_rounding_bytes == 20 * kMiB);  // kLargeBuffer (CUDA options)
  CHECK_FALSE(d.expandable_segments);
  CHECK(d.base_addr_aligned_bytes == 16 * kKiB);       // NPU default 16 (NPU options)

  const AllocatorOptions o = ParseAllocConf(
      " max_split_size_mb : 128 , garbage_collection_threshold:0.6,expandable_segments:true,"
      "max_non_split_rounding_mb:64,memory_fraction:0.5",
      Backend::kCuda);
  CHECK(o.max_split_size_bytes == 128 * kMiB);
  CHECK(o.garbage_collection_threshold == 0.6);
  CHECK(o.expandable_segments);
  CHECK(o.max_non_split_rounding_bytes == 64 * kMiB);
  CHECK(o.memory_fraction == 0.5);

  const AllocatorOptions n = ParseAllocConf("base_addr_aligned_kb:4,expandable_segments:False",
                                            Backend::kNpu);
  CHECK(n.backend == Backend::kNpu);
  CHECK(n.base_addr_aligned_bytes == 4 * kKiB);
  CHECK_FALSE(n.expandable_segments);
}

TEST_CASE("ParseAllocConf: roundup_power2_divisions forms", "[alloc]") {
  const AllocatorOptions single = ParseAllocConf("roundup_power2_divisions:4", Backend::kCuda);
  for (int d : single.roundup_power2_divisions) CHECK(d == 4);
  // [64:8,128:2,256:2,512:2,1024:1,>:1]: 64 MB is interval 6 and also fills 0..5; 128 -> 7,
  // 256 -> 8, 512 -> 9, 1024 -> 10; '>' fills 11..15.
  const AllocatorOptions list = ParseAllocConf(
      "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]", Backend::kCuda);
  const std::array<int, 16> want = {8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1};
  CHECK(list.roundup_power2_divisions == want);
}

TEST_CASE("ParseAllocConf: errors", "[alloc]") {
  using Catch::Matchers::Equals;
  CHECK_THROWS_WITH(ParseAllocConf("max_split_size_mb:20", Backend::kCuda),
                    "--alloc-conf: max_split_size_mb must be > 20, got 20");
  CHECK_THROWS_WITH(ParseAllocConf("expandable_segment:True", Backend::kCuda),
                    "--alloc-conf: unknown key 'expandable_segment' (did you mean "
                    "'expandable_segments'?)");
  CHECK_THROWS_WITH(ParseAllocConf("Expandable_Segments:True", Backend::kCuda),
                    "--alloc-conf: unknown key 'Expandable_Segments' (did you mean "
                    "'expandable_segments'?)");
  CHECK_THROWS_WITH(ParseAllocConf("base_addr_aligned_kb:8", Backend::kCuda),
                    "--alloc-conf: 'base_addr_aligned_kb' is not an option of the cuda backend");
  CHECK_THROWS_WITH(ParseAllocConf("max_non_split_rounding_mb:8", Backend::kNpu),
                    "--alloc-conf: 'max_non_split_rounding_mb' is not an option of the npu "
                    "backend");
  CHECK_THROWS_WITH(ParseAllocConf("garbage_collection_threshold:1.0", Backend::kCuda),
                    "--alloc-conf: garbage_collection_threshold must be in (0, 1), got 1.0");
  CHECK_THROWS_WITH(ParseAllocConf("garbage_collection_threshold:0", Backend::kCuda),
                    "--alloc-conf: garbage_collection_threshold must be in (0, 1), got 0");
  CHECK_THROWS_WITH(ParseAllocConf("expandable_segments:yes", Backend::kCuda),
                    "--alloc-conf: expandable_segments expects True or False, got 'yes'");
  CHECK_THROWS_WITH(ParseAllocConf("roundup_power2_divisions:3", Backend::kCuda),
                    "--alloc-conf: roundup_power2_divisions: divisions must be 0 or a power of "
                    "two, got 3");
  CHECK_THROWS_WITH(ParseAllocConf("base_addr_aligned_kb:17", Backend::kNpu),
                    "--alloc-conf: base_addr_aligned_kb must be in [0, 16], got 17");
  CHECK_THROWS_WITH(ParseAllocConf("max_split_size_mb", Backend::kCuda),
                    "--alloc-conf: expected key:value, got 'max_split_size_mb'");
  CHECK_THROWS_WITH(ParseAllocConf("max_split_size_mb:abc", Backend::kCuda),
                    "--alloc-conf: max_split_size_mb expects a non-negative integer, got 'abc'");
  CHECK_THROWS_WITH(ParseAllocConf("memory_fraction:1.5", Backend::kCuda),
                    "--alloc-conf: memory_fraction must be in [0, 1], got 1.5");
}

TEST_CASE("ParseAllocConf: a repeated key is an error", "[alloc]") {
  // Same rule as the JSON configs (duplicate keys refused); the message names the key.
  CHECK_THROWS_WITH(ParseAllocConf("max_split_size_mb:100,max_split_size_mb:200", Backend::kCuda),
                    "--alloc-conf: duplicate key 'max_split_size_mb'");
  // Spaces are ignored before comparing; a key inside a divisions list is not a top-level key.
  CHECK_THROWS_WITH(ParseAllocConf("expandable_segments:True, expandable_segments :True",
                                   Backend::kNpu),
                    "--alloc-conf: duplicate key 'expandable_segments'");
  CHECK_NOTHROW(ParseAllocConf("roundup_power2_divisions:[64:8,128:2],max_split_size_mb:64",
                               Backend::kCuda));
}

TEST_CASE("ValidateOptions: cross-option rules", "[alloc]") {
  AllocatorOptions f = ParseAllocConf("memory_fraction:0.5", Backend::kCuda);
  CHECK_THROWS_WITH(ValidateOptions(f),
                    "--alloc-conf: memory_fraction needs a device capacity (--capacity)");
  f.capacity_bytes = kGiB;
  CHECK_NOTHROW(ValidateOptions(f));
  const std::string npu_conflict =
      "--alloc-conf: on npu, expandable_segments:True cannot be combined with max_split_size_mb "
      "or garbage_collection_threshold (torch_npu rejects it)";
  CHECK_THROWS_WITH(
      ValidateOptions(ParseAllocConf("expandable_segments:True,max_split_size_mb:64",
                                     Backend::kNpu)),
      npu_conflict);
  AllocatorOptions gc = ParseAllocConf(
      "expandable_segments:True,garbage_collection_threshold:0.5,memory_fraction:0.5",
      Backend::kNpu);
  gc.capacity_bytes = kGiB;
  CHECK_THROWS_WITH(ValidateOptions(gc), npu_conflict);
  // CUDA allows the combination (issue #123548 is about its effect, not its parsing).
  CHECK_NOTHROW(ValidateOptions(
      ParseAllocConf("expandable_segments:True,max_split_size_mb:64", Backend::kCuda)));
}

}  // namespace
}  // namespace memsim::alloc
