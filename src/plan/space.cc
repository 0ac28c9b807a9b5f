// The layouts `memsim plan` tries and the rules that refuse some before any simulation
// (plan/plan.h; docs/plan.md, 'Rules').
#include <fmt/core.h>

#include <charconv>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/stack.h"
#include "core/error.h"
#include "plan/plan.h"

namespace memsim::plan {
namespace {

using config::RecomputeGranularity;

// A broken rule: the rule itself (the same words for every layout that breaks it, by which the
// table groups them) and the layout's own numbers.
struct RuleBreak {
  std::string rule;
  std::string message;
};

const char* RecomputeName(RecomputeGranularity g) {
  return g == RecomputeGranularity::kFull        ? "full"
         : g == RecomputeGranularity::kSelective ? "selective"
                                                 : "none";
}

int ParsePositive(std::string_view word, std::string_view flag, std::string_view text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
  if (word.empty() || ec != std::errc() || end != word.data() + word.size() || v < 1) {
    throw InputError(fmt::format("{} {}: '{}' is not a positive integer", flag, text, word));
  }
  return v;
}

std::vector<std::string_view> SplitList(std::string_view list) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t comma = list.find(',');
    out.push_back(list.substr(0, comma));
    if (comma == std::string_view::npos) return out;
    list.remove_prefix(comma + 1);
  }
}

// "--vary pp=1,2,1": a value listed twice would be simulated twice.
void RejectRepeated(const std::vector<std::string_view>& values, std::string_view flag,
                    std::string_view text) {
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (values[i] == values[j]) {
        throw InputError(fmt::format("{} {}: '{}' listed twice", flag, text, values[i]));
      }
    }
  }
}

// KEY's values in `space` replaced by the words of `values`.
void SetKey(std::string_view key, const std::vector<std::string_view>& values,
            std::string_view flag, std::string_view text, Space* space) {
  std::vector<int>* ints = key == "tp"    ? &space->tp
                           : key == "pp"  ? &space->pp
                           : key == "cp"  ? &space->cp
                           : key == "ep"  ? &space->ep
                           : key == "mbs" ? &space->mbs
                                          : nullptr;
  if (ints != nullptr) {
    ints->clear();
    for (std::string_view v : values) ints->push_back(ParsePositive(v, flag, text));
  } else if (key == "recompute") {
    space->recompute.clear();
    for (std::string_view v : values) {
      if (v != "none" && v != "selective" && v != "full") {
        throw InputError(fmt::format("{} {}: recompute '{}': expected none, selective or full",
                                     flag, text, v));
      }
      space->recompute.push_back(v == "full"        ? RecomputeGranularity::kFull
                                 : v == "selective" ? RecomputeGranularity::kSelective
                                                    : RecomputeGranularity::kNone);
    }
  } else if (key == "dist_opt") {
    space->dist_opt.clear();
    for (std::string_view v : values) {
      if (v != "true" && v != "false") {
        throw InputError(
            fmt::format("{} {}: dist_opt '{}': expected true or false", flag, text, v));
      }
      space->dist_opt.push_back(v == "true");
    }
  } else {
    throw InputError(fmt::format(
        "{} {}: unknown key '{}' (expected tp, pp, cp, ep, mbs, recompute or dist_opt)", flag,
        text, key));
  }
}

void Apply(std::string_view text, std::string_view flag, bool list, Space* space) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size()) {
    throw InputError(fmt::format("{} {}: expected KEY={}", flag, text, list ? "V1,V2,..." : "VALUE"));
  }
  const std::string_view value = text.substr(eq + 1);
  std::vector<std::string_view> values = list ? SplitList(value) : std::vector{value};
  if (!list && value.find(',') != std::string_view::npos) {
    throw InputError(fmt::format("{} {}: one value (use --vary for a list)", flag, text));
  }
  SetKey(text.substr(0, eq), values, flag, text, space);
  RejectRepeated(values, flag, text);
}

// Rules on the parallel sizes alone: the world, heads, layers and widths.
RuleBreak ParallelRule(const config::ModelConfig& m, const Request& r, const Layout& l) {
  // megatron/core/parallel_state.py initialize_model_parallel: the world is
  // tp × pp × cp × dp ranks, data_parallel_size = world / (tp × pp × cp).
  const int model = l.tp * l.pp * l.cp;
  if (r.devices % model != 0) {
    return {"TP × PP × CP divides the devices",
            fmt::format("TP {} × PP {} × CP {} = {} does not divide the {} devices "
                        "(parallel_state.initialize_model_parallel)",
                        l.tp, l.pp, l.cp, model, r.devices)};
  }
  if (r.per_node > 0 && l.tp > r.per_node) {
    return {"TP stays within a node (--per-node)",
            fmt::format("TP {} spans nodes of {} devices (--per-node; TP's all-reduces need "
                        "the node's links)",
                        l.tp, r.per_node)};
  }
  // Megatron TransformerConfig / memsim config/rules.h: heads, query groups and FFN width
  // divisible by TP.
  if (m.num_attention_heads % l.tp != 0 || m.num_key_value_heads % l.tp != 0) {
    return {"TP divides the attention heads and query groups",
            fmt::format("TP {} does not divide the {} attention heads and {} query groups "
                        "(Megatron TransformerConfig)",
                        l.tp, m.num_attention_heads, m.num_key_value_heads)};
  }
  if (m.intermediate_size % l.tp != 0) {
    return {"TP divides the FFN width",
            fmt::format("TP {} does not divide the FFN width {} (ColumnParallelLinear)", l.tp,
                        m.intermediate_size)};
  }
  if (m.num_hidden_layers % l.pp != 0) {
    return {"PP divides the layers",
            fmt::format("PP {} does not divide the {} layers (Megatron arguments.py: layers "
                        "divisible by the pipeline size)",
                        l.pp, m.num_hidden_layers)};
  }
  return {};
}

// Rules on the batch, sequence and experts.
RuleBreak BatchAndExpertRule(const config::Setup& base, const Request& r, const Layout& l) {
  const config::ModelConfig& m = base.model;
  // megatron/core/num_microbatches_calculator.py: global batch divisible by micro batch × DP.
  if (r.global_batch_size % (l.mbs * l.dp) != 0) {
    return {"micro batch × DP divides the global batch",
            fmt::format("global batch {} is not divisible by micro batch {} × DP {} "
                        "(num_microbatches_calculator.py)",
                        r.global_batch_size, l.mbs, l.dp)};
  }
  // Sequence parallelism (on with TP > 1) splits the sequence over TP; context parallelism
  // splits it in 2 × CP chunks (memsim config/rules.cc, after Megatron's get_batch_on_this_cp_rank).
  if (l.tp > 1 && r.seq_length % l.tp != 0) {
    return {"TP divides the sequence length (sequence parallelism)",
            fmt::format("TP {} does not divide the sequence length {} (sequence parallelism)", l.tp,
                        r.seq_length)};
  }
  if (l.cp > 1 && r.seq_length % (2 * l.cp) != 0) {
    return {"2 × CP divides the sequence length",
            fmt::format("2 × CP {} does not divide the sequence length {} (context parallelism's "
                        "load-balanced chunks)",
                        l.cp, r.seq_length)};
  }
  if (l.ep == 1) return {};
  // megatron/training/arguments.py validate_args, 'Expert parallelism check'.
  if (m.num_experts <= 1)
    return {"EP > 1 needs a mixture of experts",
            fmt::format("EP {} needs a mixture-of-experts model", l.ep)};
  if (m.num_experts % l.ep != 0) {
    return {"EP divides the experts",
            fmt::format("EP {} does not divide the {} experts (arguments.py validate_args)", l.ep,
                        m.num_experts)};
  }
  if (base.training.precision == config::Precision::kFp16) {
    return {"EP > 1 is not allowed with fp16",
            "expert parallelism with fp16 (arguments.py validate_args)"};
  }
  // parallel_state.initialize_model_parallel: the expert grid ETP × EP × expert-DP fills the
  // TP × DP × CP ranks of a stage.
  const int etp = base.training.expert_tensor_parallel_size > 0
                      ? base.training.expert_tensor_parallel_size
                      : l.tp;
  if ((l.tp * l.dp * l.cp) % (l.ep * etp) != 0) {
    return {"EP × ETP divides TP × DP × CP",
            fmt::format("EP {} × ETP {} does not divide TP × DP × CP = {} "
                        "(parallel_state.initialize_model_parallel)",
                        l.ep, etp, l.tp * l.dp * l.cp)};
  }
  return {};
}

}  // namespace

Space DefaultSpace(const config::Setup& base) {
  Space s;
  s.tp = {1, 2, 4, 8};
  s.pp = {1, 2, 4, 8};
  s.cp = {1};
  s.ep = base.model.num_experts > 1 ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1};
  s.mbs = {1, 2, 4};
  s.recompute = {RecomputeGranularity::kNone, RecomputeGranularity::kSelective,
                 RecomputeGranularity::kFull};
  s.dist_opt = base.training.use_megatron_fsdp
                   ? std::vector<bool>{base.training.use_distributed_optimizer}
                   : std::vector<bool>{true, false};
  return s;
}

void ApplyFix(std::string_view text, Space* space) { Apply(text, "--fix", false, space); }
void ApplyVary(std::string_view text, Space* space) { Apply(text, "--vary", true, space); }

namespace {

RuleBreak FirstRuleBroken(const config::Setup& base, const Request& request, const Layout& layout) {
  Layout l = layout;
  const int model = l.tp * l.pp * l.cp;
  l.dp = request.devices % model == 0 ? request.devices / model : 1;
  RuleBreak broken = ParallelRule(base.model, request, l);
  if (broken.message.empty()) broken = BatchAndExpertRule(base, request, l);
  return broken;
}

}  // namespace

std::string RuleViolated(const config::Setup& base, const Request& request, const Layout& layout) {
  return FirstRuleBroken(base, request, layout).message;
}

std::vector<Candidate> Enumerate(const config::Setup& base, const Request& r) {
  const Space& s = r.space;
  const double count = 1.0 * s.tp.size() * s.pp.size() * s.cp.size() * s.ep.size() *
                       s.mbs.size() * s.recompute.size() * s.dist_opt.size();
  if (count > kMaxLayouts) {
    throw InputError(fmt::format("the space has {:.0f} layouts, more than {}: narrow it with "
                                 "--fix KEY=VALUE", count, kMaxLayouts));
  }
  std::vector<Candidate> out;
  out.reserve(static_cast<size_t>(count));
  for (int tp : s.tp) for (int pp : s.pp) for (int cp : s.cp) for (int ep : s.ep)
  for (int mbs : s.mbs) for (RecomputeGranularity g : s.recompute) for (bool d : s.dist_opt) {
    Candidate c;
    c.layout = {tp, pp, cp, ep, 1, mbs, g, d};
    const int model = tp * pp * cp;
    c.layout.dp = r.devices % model == 0 ? r.devices / model : 0;
    RuleBreak broken = FirstRuleBroken(base, r, c.layout);
    c.reason = std::move(broken.message);
    c.rule = std::move(broken.rule);
    c.verdict = c.reason.empty() ? Verdict::kDoesNotFit : Verdict::kNotAllowed;
    out.push_back(std::move(c));
  }
  return out;
}

std::string InUserKeys(std::string message) {
  // The training keys Overrides sets, as the user names them in `memsim plan` (--fix / --vary
  // keys; the request's flags); the others keep their config names.
  static constexpr std::pair<std::string_view, std::string_view> kKeys[] = {
      {"training.tensor_model_parallel_size=", "tp="},
      {"training.pipeline_model_parallel_size=", "pp="},
      {"training.context_parallel_size=", "cp="},
      {"training.expert_model_parallel_size=", "ep="},
      {"training.data_parallel_size=", "dp="},
      {"training.micro_batch_size=", "mbs="},
      {"training.use_distributed_optimizer=", "dist_opt="},
      {"training.recompute_granularity=", "recompute="},
      {"training.global_batch_size=", "--global-batch-size "},
      {"training.seq_length=", "--seq-length "}};
  for (const auto& [key, user] : kKeys) {
    const std::string set = "--set " + std::string(key);
    for (size_t at = message.find(set); at != std::string::npos; at = message.find(set, at)) {
      message.replace(at, set.size(), user);
      at += user.size();
    }
  }
  return message;
}

std::vector<std::string> Overrides(const Layout& l, const Request& r) {
  std::vector<std::string> out = {
      fmt::format("training.tensor_model_parallel_size={}", l.tp),
      fmt::format("training.pipeline_model_parallel_size={}", l.pp),
      fmt::format("training.context_parallel_size={}", l.cp),
      fmt::format("training.expert_model_parallel_size={}", l.ep),
      fmt::format("training.data_parallel_size={}", l.dp),
      fmt::format("training.micro_batch_size={}", l.mbs),
      fmt::format("training.global_batch_size={}", r.global_batch_size),
      fmt::format("training.seq_length={}", r.seq_length),
      fmt::format("training.sequence_parallel={}", l.tp > 1 ? "true" : "false"),
      fmt::format("training.use_distributed_optimizer={}",
                  l.distributed_optimizer ? "true" : "false"),
      fmt::format("training.recompute_granularity=\"{}\"", RecomputeName(l.recompute))};
  if (l.recompute == RecomputeGranularity::kFull) {
    // Full recompute of every layer: the uniform method with one layer a chunk
    // (megatron/core/transformer/transformer_block.py _checkpointed_forward).
    out.push_back("training.recompute_method=\"uniform\"");
    out.push_back("training.recompute_num_layers=1");
  }
  return out;
}

std::string LayoutLabel(const Layout& l) {
  // dp "-": TP × PP × CP does not divide the devices, so there is no data-parallel size.
  return fmt::format("tp{} pp{} cp{} ep{} dp{} mbs{} {}{}", l.tp, l.pp, l.cp, l.ep,
                     l.dp > 0 ? std::to_string(l.dp) : "-", l.mbs, RecomputeName(l.recompute),
                     l.distributed_optimizer ? " dist_opt" : "");
}

}  // namespace memsim::plan
