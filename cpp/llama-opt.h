#pragma once

// TEMPORARY umbrella while issue 41's branches merge: include what you use instead.
#include "llama-opt-config.h"
#include "llama-opt-numerics.h"
#include "llama-opt-stats.h"
#include "llama-opt-types.h"
