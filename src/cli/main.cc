#include "cli/main_entry.h"

int main(int argc, char** argv) { return memsim::cli::Main(argc, argv); }
