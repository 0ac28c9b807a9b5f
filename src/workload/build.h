// Interface stand-in: the workload branch provides the real header (its version wins on merge).
#pragma once
#include "config/setup.h"
#include "workload/program.h"
namespace memsim::workload {
Program Build(const config::Setup& setup, int pipeline_rank);
}
