// The launch-script reader as a shell: conditions, case, functions, eval, bash's arithmetic and
// the reader's bounds (issues 30 and 32). Expected values follow bash(1) and bash's expr.c and
// are derived by hand in the comments.
#include "config/launch_script.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/megatron_args.h"
#include "core/error.h"

namespace memsim::config {
namespace {

std::vector<std::string> LaunchArgs(const MegatronLaunch& l) {
  std::vector<std::string> out;
  for (const LaunchArgument& a : l.arguments) {
    std::string s = a.name;
    for (size_t i = 0; i < a.values.size(); ++i) s += (i == 0 ? "=" : " ") + a.values[i];
    out.push_back(s);
  }
  return out;
}

std::string LaunchError(const std::string& text) {
  try {
    ReadLaunchScript("t.sh", text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The message of loading `l` as a Megatron launch on an H100 ("" when it loads).
std::string LaunchLoadError(const MegatronLaunch& l) {
  LoadOptions o;
  o.device = "h100-80g";
  try {
    LoadSetupFromMegatron(l, o, {});
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The value of `--v` after `text` (a script without its training command).
std::string V(const std::string& text, const std::vector<std::string>& args = {}) {
  const MegatronLaunch l =
      ReadLaunchScript("t.sh", text + "\npython pretrain_gpt.py --v \"$V\"\n", args);
  return l.arguments.at(0).values.at(0);
}

// The values of the last argument named `name` ("" joined by blanks), or "<absent>".
std::string ValueOf(const MegatronLaunch& l, const std::string& name) {
  std::string out = "<absent>";
  for (const LaunchArgument& a : l.arguments) {
    if (a.name != name) continue;
    out.clear();
    for (const std::string& v : a.values) out += (out.empty() ? "" : " ") + v;
  }
  return out;
}

size_t WarnedAbout(const MegatronLaunch& l, const std::string& what) {
  return static_cast<size_t>(
      std::count_if(l.warnings.begin(), l.warnings.end(),
                    [&](const std::string& w) { return w.find(what) != std::string::npos; }));
}

}  // namespace

TEST_CASE("launch script: if/elif/else follows the variables' values", "[launch]") {
  const std::string script = R"(DTYPE=${DTYPE:-fp8}
if [ "$DTYPE" = fp8 ]; then
  P=--fp8-format
elif [[ $DTYPE == bf* ]]; then
  P=--bf16
else
  P=--fp16
fi
python pretrain_gpt.py $P
)";
  CHECK(LaunchArgs(ReadLaunchScript("t.sh", script)) == std::vector<std::string>{"--fp8-format"});
  // The same script with its own variable switched: the elif's glob bf* matches "bf16".
  std::string bf16 = script;
  bf16.replace(bf16.find("fp8}"), 3, "bf16");
  const MegatronLaunch l = ReadLaunchScript("t.sh", bf16);
  CHECK(LaunchArgs(l) == std::vector<std::string>{"--bf16"});
  CHECK(l.warnings.empty());
  // -z / -n, numeric comparisons, ! and nesting.
  CHECK(V("A=\nif [ -z \"$A\" ]; then V=empty; else V=set; fi") == "empty");
  CHECK(V("A=3\nif [ $A -ge 2 ] && [ $A -lt 4 ]; then V=yes; else V=no; fi") == "yes");
  CHECK(V("A=3\nif ! [ $A -eq 3 ]; then V=no; elif [ $A -ne 3 ]; then V=no2; else V=else; fi") ==
        "else");
  CHECK(V("if true; then if false; then V=inner; else V=outer; fi; fi") == "outer");
  CHECK(V("A=1\nif [[ $A -eq 1 && ( -n x || -z x ) ]]; then V=ok; fi") == "ok");
  CHECK(V("if (( 2 * 3 > 5 )); then V=arith; fi") == "arith");
}

TEST_CASE("launch script: && and || lists run as bash runs them", "[launch]") {
  CHECK(V("V=a\n[ -z \"$V\" ] && V=b") == "a");
  CHECK(V("V=a\n[ -n \"$V\" ] && V=b") == "b");
  CHECK(V("V=a\nfalse || V=c") == "c");
  CHECK(V("V=a\ntrue || V=c") == "a");
  // a && b || c with a false: b is skipped, its status stays false, c runs.
  CHECK(V("false && V=b || V=c") == "c");
  // A command memsim does not run is taken to succeed: `mkdir ... || exit 1` goes on.
  CHECK(V("mkdir -p /x || exit 1\nV=after") == "after");
}

TEST_CASE("launch script: a condition memsim cannot evaluate takes the first branch, named",
          "[launch]") {
  const MegatronLaunch l = ReadLaunchScript("t.sh", R"(if [ -f /etc/hosts ]; then
  A=1
else
  A=2
fi
if [[ $A =~ ^[0-9]+$ ]]; then B=re; fi
python pretrain_gpt.py --a $A --b $B
)");
  // A file test is taken as true (the file exists), said; =~ is not evaluated: its `if` takes
  // the first branch, said.
  CHECK(LaunchArgs(l) == std::vector<std::string>{"--a=1", "--b=re"});
  CHECK(WarnedAbout(l,
                    "t.sh:1: '-f /etc/hosts' tests a file or the terminal (memsim reads only "
                    "the script); taken as true") == 1);
  CHECK(WarnedAbout(l, "t.sh:1: 'if' condition not evaluated") == 0);
  CHECK(WarnedAbout(l, "t.sh:6: '1 =~ ^[0-9]+$' (a regular expression) not evaluated") == 1);
  CHECK(WarnedAbout(l, "t.sh:6: 'if' condition not evaluated; the first branch taken") == 1);
  // A command memsim does not run: the first branch, said.
  const MegatronLaunch cmd =
      ReadLaunchScript("t.sh",
                       "if command -v nvidia-smi; then A=gpu; else A=npu; fi\n"
                       "python pretrain_gpt.py --a $A\n");
  CHECK(LaunchArgs(cmd) == std::vector<std::string>{"--a=gpu"});
  CHECK(WarnedAbout(cmd, "t.sh:1: 'if' condition not evaluated; the first branch taken") == 1);
}

TEST_CASE("launch script: case ... esac matches glob patterns in order", "[launch]") {
  const std::string script = R"(case $MODEL in
  7B|8B)
    L=32 ;;
  70*)
    L=80
    ;;
  *) L=2 ;;
esac
python pretrain_gpt.py --num-layers $L
)";
  auto layers = [&](const std::string& model) {
    return LaunchArgs(ReadLaunchScript("t.sh", "MODEL=" + model + "\n" + script)).at(0);
  };
  CHECK(layers("8B") == "--num-layers=32");
  CHECK(layers("70B") == "--num-layers=80");
  CHECK(layers("13B") == "--num-layers=2");
  // Only the first matching item runs; a skipped item's expansions are not evaluated (no
  // division by zero refused in it).
  CHECK(V("case x in\n x) V=first ;;\n x) V=$((1/0)) ;;\nesac") == "first");
}

TEST_CASE("launch script: functions are called with their arguments", "[launch]") {
  const MegatronLaunch l = ReadLaunchScript("t.sh", R"(set_model() {
  local size=$1
  if [ "$size" = small ]; then LAYERS=2; else LAYERS=$2; fi
  return 0
  LAYERS=never
}
function launch {
  torchrun --nproc_per_node $1 pretrain_gpt.py --num-layers $LAYERS --n "$#"
}
set_model big 48
launch 4
)");
  // set_model big 48: $1 = big, so the else branch: LAYERS=$2 = 48; `return` stops the body.
  // launch 4: $1 = 4 processes, "$#" = 1 argument.
  CHECK(LaunchArgs(l) == std::vector<std::string>{"--num-layers=48", "--n=1"});
  CHECK(l.nproc_per_node == 4);
  CHECK(l.warnings.empty());
  // A function calling itself is refused at the nesting bound, with the line.
  CHECK(LaunchError("f() { f; }\nf\n").find("nested deeper than 100 levels") != std::string::npos);
}

TEST_CASE("launch script: eval of a built command, exit, heredocs", "[launch]") {
  // Pai-Megatron-Patch builds the command in a string and runs `eval ${run_cmd}`.
  const MegatronLaunch l =
      ReadLaunchScript("t.sh", R"(megatron_options="--num-layers 4 --hidden-size 64"
run_cmd="torchrun --nproc_per_node 2 pretrain_qwen.py ${megatron_options} --name 'a b'"
cat <<EOF > notes.txt
python pretrain_gpt.py --not-this 1
EOF
echo ${run_cmd}
eval ${run_cmd}
exit 0
python pretrain_gpt.py --after-exit
)");
  CHECK(LaunchArgs(l) ==
        std::vector<std::string>{"--num-layers=4", "--hidden-size=64", "--name=a b"});
  CHECK(l.nproc_per_node == 2);
  CHECK(l.arguments[0].line == 7);  // the eval's line
  CHECK(l.warnings.empty());
  CHECK(LaunchError("exit 1\npython pretrain_gpt.py --a 1\n")
            .ends_with("; the script exits at line 1"));
}

TEST_CASE("launch script: ${#x}, ${x%...}, ${x#...}, ${x:off:len}", "[launch]") {
  // bash(1) "Parameter Expansion": lengths, the shortest / longest matching suffix / prefix
  // removed, substrings by character (negative offset from the end) and by array element.
  CHECK(V("A=abc.def.gz\nV=${#A}") == "10");
  CHECK(V("A=(x y z)\nV=${#A[@]}") == "3");
  CHECK(V("A=abc.def.gz\nV=${A%.*}") == "abc.def");
  CHECK(V("A=abc.def.gz\nV=${A%%.*}") == "abc");
  CHECK(V("A=/ckpt/llama/7b\nV=${A#*/}") == "ckpt/llama/7b");
  CHECK(V("A=/ckpt/llama/7b\nV=${A##*/}") == "7b");
  CHECK(V("A=Qwen3-30B-A3B\nV=${A:0:5}") == "Qwen3");
  CHECK(V("A=Qwen3-30B-A3B\nV=${A: -3}") == "A3B");
  CHECK(V("A=Qwen3-30B-A3B\nV=${A:6:-4}") == "30B");
  CHECK(V("A=(a b c d)\nV=\"${A[@]:1:2}\"") == "b c");
  CHECK(V("A=(a b c d)\nV=${A[-1]}${A[1+1]}") == "dc");
}

TEST_CASE("launch script: the script's own arguments", "[launch]") {
  const std::string script =
      "TP=${1:-1}\nshift\npython pretrain_gpt.py --tp $TP --rest \"$@\" --n $#\n";
  const MegatronLaunch given = ReadLaunchScript("t.sh", script, {"4", "x", "y"});
  CHECK(LaunchArgs(given) == std::vector<std::string>{"--tp=4", "--rest=x y", "--n=2"});
  CHECK(given.warnings.empty());
  // Not given: the default, and $@ / $# named as unknown script arguments.
  const MegatronLaunch none = ReadLaunchScript("t.sh", script);
  CHECK(LaunchArgs(none).at(0) == "--tp=1");
  CHECK(WarnedAbout(none, "t.sh:3: $# is a script argument, not known here") == 1);
}

TEST_CASE("launch script: what it cannot evaluate is named with the line", "[launch]") {
  const MegatronLaunch l = ReadLaunchScript("t.sh", R"(A=abc
B=${A/b/x}
for i in 1 2; do C=$i; done
while true; do :; done
python pretrain_gpt.py --b "$B"
)");
  CHECK(l.warnings == std::vector<std::string>{"t.sh:2: ${A/b/x} not evaluated; taken as empty",
                                               "t.sh:3: 'for' loop not evaluated; skipped",
                                               "t.sh:4: 'while' loop not evaluated; skipped"});
}

TEST_CASE("launch script: an expansion to nothing after a flag leaves a hint", "[launch]") {
  // issue 32: "--num-layers: expected a value" said nothing of why.
  const MegatronLaunch l = ReadLaunchScript("t.sh",
                                            "NL=\nARGS=\"--num-layers $NL --x 1\"\n"
                                            "python pretrain_gpt.py $ARGS --hidden-size $H\n");
  CHECK(LaunchArgs(l) == std::vector<std::string>{"--num-layers", "--x=1", "--hidden-size"});
  CHECK(l.hints == std::vector<std::string>{
                       "t.sh:2: --num-layers: its value $NL expanded to nothing (NL is empty)",
                       "t.sh:3: --hidden-size: its value $H expanded to nothing (H is not set)"});
}

TEST_CASE("launch script: an error about a flag's missing value gives the hint", "[launch]") {
  const MegatronLaunch l = ReadLaunchScript(
      "t.sh",
      "NL=\npython pretrain_gpt.py --num-layers $NL --hidden-size 64 --num-attention-heads 4 "
      "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1000\n");
  CHECK(LaunchLoadError(l) ==
        "t.sh:2: --num-layers: expected a value (on that line: --num-layers: its value $NL "
        "expanded to nothing (NL is empty))");
}

TEST_CASE("launch script: every out-of-range flag value is reported in one run, by flag",
          "[launch]") {
  // Three values the loader refuses (a positive integer is required): all three in one message,
  // each named by the script's line and flag (the hidden size is the model's n_embd inside
  // memsim, which the message does not name), in the order the loader reads them.
  const MegatronLaunch l = ReadLaunchScript(
      "t.sh",
      "python pretrain_gpt.py --num-layers 2 --hidden-size -5 --num-attention-heads 4 "
      "--seq-length 128 --vocab-size 1000 --micro-batch-size 0 --tensor-model-parallel-size 0\n");
  CHECK(LaunchLoadError(l) ==
        "3 problems in t.sh:\n"
        "  t.sh:1: --hidden-size: expected a positive integer, got -5\n"
        "  t.sh:1: --micro-batch-size: expected a positive integer, got 0\n"
        "  t.sh:1: --tensor-model-parallel-size: expected a positive integer, got 0");
}

TEST_CASE("launch script: a value that is not a number comes with the out-of-range ones",
          "[launch]") {
  // --micro-batch-size abc cannot be read at all (the translator's integer parse) and is left
  // out; the loader still reads the rest and refuses the two out-of-range values: one message,
  // the unreadable value first, then the loader's in its order (as in the test above).
  const MegatronLaunch l = ReadLaunchScript(
      "t.sh",
      "python pretrain_gpt.py --num-layers 2 --hidden-size -5 --num-attention-heads 4 "
      "--seq-length 128 --vocab-size 1000 --micro-batch-size abc --tensor-model-parallel-size 0\n");
  CHECK(LaunchLoadError(l) ==
        "3 problems in t.sh:\n"
        "  t.sh:1: --micro-batch-size: expected an integer, got 'abc'\n"
        "  t.sh:1: --hidden-size: expected a positive integer, got -5\n"
        "  t.sh:1: --tensor-model-parallel-size: expected a positive integer, got 0");
  // An unreadable --num-layers: the model is then missing from the arguments, an error that
  // follows from it (it names --num-layers) and is not listed. (The loader, which needs the
  // model, is not reached: its range checks come once the value is fixed.)
  const MegatronLaunch m = ReadLaunchScript(
      "t.sh",
      "python pretrain_gpt.py --num-layers x2 --hidden-size 64 --num-attention-heads 4 "
      "--seq-length 128 --vocab-size 1000 --micro-batch-size 1\n");
  CHECK(LaunchLoadError(m) == "t.sh:1: --num-layers: expected an integer, got 'x2'");
}

TEST_CASE("launch script: arithmetic wraps at 64 bits as bash's does", "[launch]") {
  // expr.c: INT64_MIN / -1 gives INT64_MIN and INT64_MIN % -1 gives 0 (no SIGFPE); + and *
  // wrap modulo 2^64: INT64_MAX + 1 = INT64_MIN, INT64_MAX * 2 = -2; -INT64_MIN = INT64_MIN.
  CHECK(V("V=$(( (-9223372036854775807-1) / -1 ))") == "-9223372036854775808");
  CHECK(V("V=$(( (-9223372036854775807-1) % -1 ))") == "0");
  CHECK(V("V=$((9223372036854775807+1))") == "-9223372036854775808");
  CHECK(V("V=$((9223372036854775807*2))") == "-2");
  CHECK(V("X=-9223372036854775808\nV=$((-X))") == "-9223372036854775808");
  // Precedence (bash(1) "ARITHMETIC EVALUATION"): ** over * over + over << over < over == over
  // && over ?:; constants in hex, octal and base#digits.
  CHECK(V("V=$((2 + 3 * 2 ** 3))") == "26");
  CHECK(V("V=$((1 << 4 + 1))") == "32");
  CHECK(V("V=$((0x10 + 010 + 2#101))") == "29");
  CHECK(V("V=$((3 > 2 && 2 == 2 ? 7 : 9))") == "7");
  CHECK(V("V=$((0 && 1/0))") == "0");  // the unused side is not evaluated
}

TEST_CASE("launch script: bad arithmetic is refused with the line", "[launch]") {
  CHECK(LaunchError("A=1\nB=$((A / 0))\n") ==
        "t.sh:2: division by zero in $((A / 0)) (bash stops the script here)");
  CHECK(LaunchError("B=$((5 % (1-1)))\n") ==
        "t.sh:1: division by zero in $((5 % (1-1))) (bash stops the script here)");
  // Unterminated: "$((2*(3+4))" closes its inner group and then has one ')' only.
  CHECK(LaunchError("python pretrain_gpt.py --num-layers $((2*(3+4))\n") ==
        "t.sh:1: unterminated $((2*(3+4) (no matching '))')");
}

TEST_CASE("launch script: nesting, sizes and commands have bounds", "[launch]") {
  // 100,000 nested parentheses in $((...)): refused at 100 levels, no stack overflow.
  const std::string parens =
      "A=$((" + std::string(100000, '(') + "1" + std::string(100000, ')') + "))\n";
  CHECK(LaunchError(parens).starts_with("t.sh:1: $(("));
  CHECK(LaunchError(parens).find("nested deeper than 100 levels") != std::string::npos);
  // 50,000 nested ${A:-${A:-...}}: refused at 100 levels.
  std::string braces = "B=";
  for (int i = 0; i < 50000; ++i) braces += "${A:-";
  braces += "x" + std::string(50000, '}') + "\n";
  CHECK(LaunchError(braces).find("nested deeper than 100 levels") != std::string::npos);
  // X="$X$X" doubles: 2^18 = 262,144 bytes = 256 KiB is the last allowed, 2^19 is refused at
  // the 19th doubling (line 20).
  std::string doubling = "X=x\n";
  for (int i = 0; i < 60; ++i) doubling += "X=\"$X$X\"\n";
  CHECK(LaunchError(doubling).starts_with("t.sh:20: "));
  CHECK(LaunchError(doubling).find("longer than 256 KiB") != std::string::npos);
  // A+=( ${A[@]} ) doubles the elements: 2^14 = 16,384 allowed, 2^15 refused (line 16).
  std::string array = "A=(x)\n";
  for (int i = 0; i < 60; ++i) array += "A+=( ${A[@]} )\n";
  CHECK(LaunchError(array).starts_with("t.sh:16: "));
  CHECK(LaunchError(array).find("16384") != std::string::npos);
  // Functions calling each other twice each, 30 levels: 2^30 commands, refused at 1,000,000.
  std::string calls = "f0() { :; }\n";
  for (int i = 1; i <= 30; ++i) {
    calls += "f" + std::to_string(i) + "() { f" + std::to_string(i - 1) + "; f" +
             std::to_string(i - 1) + "; }\n";
  }
  CHECK(LaunchError(calls + "f30\n").find("more than 1000000 commands") != std::string::npos);
}

TEST_CASE("launch script: 100,000 arithmetic assignments read in one pass", "[launch]") {
  // issue 32: 30,000 such lines took 224 s (each expansion copied every variable). Reading is
  // linear now; no timing is asserted, the result is: A counts the 100,000 increments.
  std::string script;
  for (int i = 0; i < 100000; ++i) script += "A=$((A + 1))\nB" + std::to_string(i) + "=$A\n";
  script += "python pretrain_gpt.py --a $A\n";
  const MegatronLaunch l = ReadLaunchScript("t.sh", script);
  CHECK(LaunchArgs(l) == std::vector<std::string>{"--a=100000"});
  CHECK(l.warnings ==
        std::vector<std::string>{"t.sh:1: A in $((...)) is not set in the script; taken as 0"});
}

TEST_CASE("launch script: Megatron-LM's train_llama3_8b_h100_fp8.sh, unedited", "[launch]") {
  const MegatronLaunch l =
      ReadMegatronArgsFile(std::string(MEMSIM_SOURCE_DIR) +
                           "/tests/data/launch_scripts/megatron_train_llama3_8b_h100_fp8.sh");
  // DTYPE="fp8": the `if [[ "$DTYPE" == "fp8" ]]` branch adds the FP8 arguments.
  CHECK(ValueOf(l, "--fp8-format") == "hybrid");
  CHECK(ValueOf(l, "--fp8-amax-history-len") == "1024");
  // No script arguments: TOKENIZER_ARG defaults to MOCK, so the mock-data branch.
  CHECK(ValueOf(l, "--mock-data").empty());
  CHECK(ValueOf(l, "--vocab-size") == "128256");
  CHECK(ValueOf(l, "--tokenizer-model") == "<absent>");
  // `if [ ! -f "$PRETRAIN_SCRIPT_PATH" ]; then ... exit 1; fi`: the file is taken to exist, so
  // the script goes on to torchrun (line 187) with its world size.
  CHECK(l.launch_line == 187);
  CHECK(l.nproc_per_node == 8);
  CHECK(l.nnodes == 1);
  CHECK(WarnedAbout(l, "'-f pretrain_gpt.py' tests a file") == 1);
  CHECK(WarnedAbout(l, "'if' condition not evaluated") == 0);
}

TEST_CASE("launch script: Pai-Megatron-Patch's run_mcore_qwen3.sh, unedited, with its arguments",
          "[launch]") {
  // The script takes 27 positional arguments; these select Qwen3-30B-A3B (MODEL_SIZE=A3B) in
  // bf16, TP 1, EP 4, the distributed optimizer, flash attention, selective recompute, and
  // 10^10 training tokens. It builds `run_cmd` in a string and runs `eval ${run_cmd}` (line 507).
  const std::vector<std::string> args = {
      "dsw", "A3B",   "1",      "8",  "1e-5", "1e-6", "1024",        "1024",  "bf16",
      "1",   "1",     "1",      "1",  "4",    "true", "true",        "true",  "false",
      "sel", "false", "100000", "/d", "/v",   "none", "10000000000", "10000", "/o"};
  const MegatronLaunch l = ReadMegatronArgsFile(
      std::string(MEMSIM_SOURCE_DIR) + "/tests/data/launch_scripts/eval_pai_run_mcore_qwen3.sh",
      args);
  CHECK(l.launch_line == 507);
  // The A3B branch of `if [ $MODEL_SIZE = ... ]`.
  CHECK(ValueOf(l, "--num-layers") == "48");
  CHECK(ValueOf(l, "--hidden-size") == "2048");
  CHECK(ValueOf(l, "--num-experts") == "128");
  CHECK(ValueOf(l, "--moe-ffn-hidden-size") == "768");
  CHECK(ValueOf(l, "--expert-model-parallel-size") == "4");
  CHECK(ValueOf(l, "--moe-layer-freq") == "([1]*48)");  // single quotes inside the string
  CHECK(ValueOf(l, "--num-query-groups") == "4");
  CHECK(ValueOf(l, "--untie-embeddings-and-output-weights").empty());
  // PR=bf16, FL=true, AC=sel, DO=true; SP=true but TP 1: no --sequence-parallel.
  CHECK(ValueOf(l, "--bf16").empty());
  CHECK(ValueOf(l, "--fp16") == "<absent>");
  CHECK(ValueOf(l, "--attention-backend") == "flash");
  CHECK(ValueOf(l, "--recompute-activations").empty());
  CHECK(ValueOf(l, "--use-distributed-optimizer").empty());
  CHECK(ValueOf(l, "--sequence-parallel") == "<absent>");
  CHECK(ValueOf(l, "--load") == "<absent>");  // PRETRAIN_CHECKPOINT_PATH=none
  // SFT=false: TRAIN_ITERS = 10^10 / 8 / 1024 = 1,220,703 (integer division).
  CHECK(ValueOf(l, "--train-iters") == "1220703");
  CHECK(ValueOf(l, "--train-mode") == "pretrain");
  // GPUS_PER_NODE comes from `python -c ...` (not run): torchrun's --nproc_per_node has no
  // value, said; --nnodes 1 from the dsw branch.
  CHECK_FALSE(l.nproc_per_node.has_value());
  CHECK(l.nnodes == 1);
  CHECK(WarnedAbout(l, "--nproc_per_node: no value") == 1);
  CHECK(WarnedAbout(l, "'if' condition not evaluated") == 0);
}

TEST_CASE("launch script: --script-var pins a variable against the script's own assignments",
          "[launch]") {
  // As `make NAME=VALUE` overrides a makefile: the pinned value is set before line 1 and every
  // assignment form the script uses on it (plain, +=, ${X:=...}, unset) is skipped.
  const std::string script = R"(DTYPE="fp8"
DTYPE+=x
: ${DTYPE:=fp16}
unset DTYPE
if [[ "$DTYPE" == "fp8" ]]; then P=--fp8-format; else P=--bf16; fi
python pretrain_gpt.py $P
)";
  const MegatronLaunch l = ReadLaunchScript("t.sh", script, {}, {{"DTYPE", "bf16"}});
  CHECK(LaunchArgs(l) == std::vector<std::string>{"--bf16"});
  // Lines 1 (plain), 2 (+=) and 4 (unset); line 3's `:=` assigns only an unset variable, and
  // the pinned one is set.
  CHECK(WarnedAbout(l, "--script-var DTYPE=bf16: the script's own assignments at lines 1, 2, 4 "
                       "skipped") == 1);
  // Read as it is, the script's own value decides.
  const std::string own = "DTYPE=fp8\n" + script.substr(script.find("if"));
  CHECK(LaunchArgs(ReadLaunchScript("t.sh", own)) == std::vector<std::string>{"--fp8-format"});
  // A pinned name the script never uses is told, not silently dropped (a misspelling).
  const MegatronLaunch typo = ReadLaunchScript("t.sh", own, {}, {{"DTPYE", "bf16"}});
  CHECK(LaunchArgs(typo) == std::vector<std::string>{"--fp8-format"});
  CHECK(WarnedAbout(typo, "--script-var DTPYE=bf16: the script neither sets nor reads $DTPYE") ==
        1);
  // Only read (an environment variable the script expects): set before line 1.
  const MegatronLaunch env = ReadLaunchScript("t.sh", "python pretrain_gpt.py --v $NNODES\n",
                                              {}, {{"NNODES", "2"}});
  CHECK(ValueOf(env, "--v") == "2");
  CHECK(WarnedAbout(env, "--script-var NNODES=2: set before the script's first line") == 1);
}

TEST_CASE("launch script: --script-var takes NAME=VALUE with a shell variable name", "[launch]") {
  CHECK(ParseScriptVariable("DTYPE=bf16", "--script-var") == ScriptVariable{"DTYPE", "bf16"});
  CHECK(ParseScriptVariable("_X1=", "--script-var") == ScriptVariable{"_X1", ""});
  CHECK(ParseScriptVariable("A=b=c", "--script-var") == ScriptVariable{"A", "b=c"});
  for (const char* bad : {"DTYPE", "=bf16", "1X=2", "A-B=1", "A B=1"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(ParseScriptVariable(bad, "--script-var"),
                      Catch::Contains("--script-var") && Catch::Contains("expected NAME=VALUE"));
  }
}

}  // namespace memsim::config
