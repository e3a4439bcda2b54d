// The two network hooks LightGBM calls (its meta.h: ReduceScatterFunction, AllgatherFunction),
// as thin C++ functions over the binding's Rust (src/lightgbm.rs).
//
// The hooks return nothing, so the only way an error reaches LightGBM is a C++ exception: its C
// API catches it and returns -1 with the message, which Python's lightgbm raises as
// LightGBMError. Rust returns the message (or null); this side throws std::runtime_error with
// it. No Rust frame is ever unwound by the exception, and no Rust panic crosses into C++ (the
// Rust side catches them and returns their message).

#include <cstdint>
#include <stdexcept>
#include <string>

extern "C" {
using silvic_reducer = void (*)(const char* input, char* output, int type_size, int32_t array_size);

const char* silvic_lgbm_reduce_scatter(char* input, int32_t input_size, int type_size,
                                       const int32_t* block_start, const int32_t* block_len,
                                       int num_block, char* output, int32_t output_size,
                                       silvic_reducer reducer);
const char* silvic_lgbm_allgather(char* input, int32_t input_size, const int32_t* block_start,
                                  const int32_t* block_len, int num_block, char* output,
                                  int32_t output_size);
void silvic_lgbm_free_message(const char* message);
}

namespace {

// Throws the message Rust returned, if any, after handing its memory back to Rust.
void raise_if_failed(const char* message) {
  if (message == nullptr) {
    return;
  }
  std::string text(message);
  silvic_lgbm_free_message(message);
  throw std::runtime_error(text);
}

void reduce_scatter_hook(char* input, int32_t input_size, int type_size,
                         const int32_t* block_start, const int32_t* block_len, int num_block,
                         char* output, int32_t output_size, const silvic_reducer& reducer) {
  raise_if_failed(silvic_lgbm_reduce_scatter(input, input_size, type_size, block_start,
                                             block_len, num_block, output, output_size, reducer));
}

void allgather_hook(char* input, int32_t input_size, const int32_t* block_start,
                    const int32_t* block_len, int num_block, char* output, int32_t output_size) {
  raise_if_failed(silvic_lgbm_allgather(input, input_size, block_start, block_len, num_block,
                                        output, output_size));
}

}  // namespace

extern "C" {
// The hooks' addresses, for LGBM_NetworkInitWithFunctions.
void* silvic_lgbm_reduce_scatter_hook() { return reinterpret_cast<void*>(&reduce_scatter_hook); }
void* silvic_lgbm_allgather_hook() { return reinterpret_cast<void*>(&allgather_hook); }
}
