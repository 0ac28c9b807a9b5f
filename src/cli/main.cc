#include "cli/commands.h"

int main(int argc, char** argv) { return memsim::cli::Main(argc, argv); }
