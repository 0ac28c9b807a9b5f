// A Megatron-LM / MindSpeed-LLM launch as users keep it: the shell script that runs
// `torchrun ... pretrain_gpt.py --num-layers 32 ...`, a training log holding Megatron's printed
// `---- arguments ----` block, or the arguments themselves. Reading one yields the training
// script's arguments in order, each with the line it was written on, the launcher's world size,
// and a warning for everything the reader could not evaluate (naming the line and the value it
// took). What the arguments mean is not decided here (megatron_args.h does that).
// Deliberately not a shell: no command is run, no file is read but the one given, conditions are
// not evaluated (the first branch of an `if` is taken), loop and function bodies are skipped.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memsim::config {

// One argument of the training script: "--num-layers" with its values ({"32"}), as written; a
// flag without a value (store_true) has none, one with nargs="+" several. From a training log,
// `name` is Megatron's attribute name ("num_layers") and the one value is Python's repr of it
// ("32", "True", "None", "['core_attn']", "AttnBackend.flash").
struct LaunchArgument {
  std::string name;
  std::vector<std::string> values;
  int line = 0;  // 1-based line of the source; 0 = the command line
  bool operator==(const LaunchArgument&) const = default;
};

struct MegatronLaunch {
  enum class Kind { kScript, kLog, kCommandLine };
  Kind kind = Kind::kScript;
  std::string label;  // the file as named on the command line, or "--megatron-args"
  std::vector<LaunchArgument> arguments;
  // Processes per node and nodes, from the launcher (torchrun --nproc_per_node / --nnodes, msrun
  // --local_worker_num / --worker_num) or the script's GPUS_PER_NODE / NPUS_PER_NODE and NNODES
  // / NUM_NODES; absent when the launch does not say.
  std::optional<int> nproc_per_node;
  std::optional<int> nnodes;
  int launch_line = 0;  // the line of the training command (script), or of the arguments block
  // "<label>:<line>: <what was not evaluated>; <the value taken>", in order of the lines.
  std::vector<std::string> warnings;
  // Values the script defaulted (`${VAR:-x}` with VAR unset), for --verbose.
  std::vector<std::string> notes;
  // The environment the script gives the training process: `export NAME=value`, `export NAME`
  // of a variable set before, and `NAME=value` words before the training command; in order of
  // the lines (a later one for the same name wins). Scripts only.
  struct Export {
    std::string name;
    std::string value;
    int line = 0;
    bool operator==(const Export&) const = default;
  };
  std::vector<Export> exports;
};

// Reads a launch script. Throws InputError "<label>:<line>: ..." when the text cannot be read as
// a script (an unterminated quote) or holds no training command.
MegatronLaunch ReadLaunchScript(const std::string& label, std::string_view text);

// Reads the `---- arguments ----` block of a Megatron training log. Throws InputError when the
// block is absent or unterminated.
MegatronLaunch ReadArgumentsLog(const std::string& label, std::string_view text);

// True iff `text` holds Megatron's printed arguments block (a line "---- arguments ----").
bool LooksLikeArgumentsLog(std::string_view text);

// The training script's arguments given on the command line (`--megatron-args -- ARGS...`).
MegatronLaunch ReadCommandLineArguments(const std::vector<std::string>& words);

// Reads FILE as a training log when it holds an arguments block, else as a launch script.
// Throws InputError "<path>: cannot read the file: <why>" when it cannot be read.
MegatronLaunch ReadMegatronArgsFile(const std::string& path);

}  // namespace memsim::config
