// Generates text from a .tinyloop model with the public C++ API (docs/cpp-api.md):
//   generate_text MODEL [PROMPT] [LOOPS]
// Streams the continuation of PROMPT (default "Once upon a time") as it is generated, then
// prints the loop depth and why generation stopped. Errors print their message and exit 1.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tinyloop/tinyloop.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::cerr << "usage: " << argv[0] << " MODEL [PROMPT] [LOOPS]\n";
    return 2;
  }
  try {
    const tinyloop::Engine engine(argv[1]);
    const tinyloop::Tokenizer* tokenizer = engine.tokenizer();
    if (!tokenizer) {
      std::cerr << argv[1] << " carries no tokenizer, so it cannot take a text prompt\n";
      return 1;
    }
    const std::string prompt = argc > 2 ? argv[2] : "Once upon a time";
    std::vector<int32_t> ids = tokenizer->encode(prompt);
    if (engine.info().bos_id) ids.insert(ids.begin(), *engine.info().bos_id);

    tinyloop::GenerationOptions options;
    options.max_tokens = 48;
    if (argc > 3) {
      char* end = nullptr;
      const long long loops = std::strtoll(argv[3], &end, 10);
      if (end == argv[3] || *end) {
        std::cerr << "LOOPS must be an integer, got '" << argv[3] << "'\n";
        return 2;
      }
      options.loops = loops;  // the engine checks the range and names "loops"
    }
    options.temperature = 0.8f;
    options.top_k = 40;
    options.seed = 7;  // the same text on every run

    // Stream: print each token's bytes as soon as it is chosen (the prompt first, once the
    // options have passed the engine's checks).
    bool started = false;
    const tinyloop::GenerationResult result = engine.generate(ids, options, [&](int32_t token) {
      if (!started) std::cout << prompt, started = true;
      std::cout << tokenizer->token_bytes(token) << std::flush;
      return true;
    });
    std::cout << "\n";

    double loops = 0;
    for (int64_t l : result.loops_per_token) loops += static_cast<double>(l);
    std::cerr << result.tokens.size() << " tokens, mean loops "
              << (result.tokens.empty() ? 0.0 : loops / static_cast<double>(result.tokens.size()))
              << ", finish: " << tinyloop::finish_reason_name(result.finish_reason) << "\n";
    return 0;
  } catch (const tinyloop::FileNotFound& e) {  // thrown inside the library, caught by type here
    std::cerr << "model not found: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
