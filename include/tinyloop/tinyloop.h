// The public C++ API in one include (docs/cpp-api.md): Engine (engine.h), its options and
// results (generation.h), Tokenizer (tokenizer.h) and the exception types (errors.h).
#pragma once
#include "tinyloop/engine.h"
#include "tinyloop/errors.h"
#include "tinyloop/generation.h"
#include "tinyloop/tokenizer.h"
