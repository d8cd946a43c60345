// A GGUF model read as a Hugging Face folder would be: config.json's fields
// from the metadata (then parsed by the family units), the tensors under
// Hugging Face names in Hugging Face layouts (llama.cpp's Q/K row order and
// GPT-2's transposed matrices undone), the tokenizer from tokenizer.ggml.*
// and the chat template; and the way back (`tessera quantize`). Every command
// that takes --model takes a .gguf file: load_config, TensorStore::open_dir,
// load_tokenizer and ChatTemplate::load send such a path here.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "kernels/quant.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace tessera::model {

// A regular-file path ending in ".gguf".
bool is_gguf_path(const std::string& path);

// config.json's text for the file: general.architecture gpt2, llama, qwen2 or qwen3.
core::Result<std::string> gguf_config_json(const GgufFile& f);
// The most common block type of the layers' matrices in the file (F32 for
// F32/F16/BF16 files): a deployment in that type keeps every matrix's own
// blocks (gguf_blocks), whatever its type; another type widens and
// quantizes them again.
kernels::WeightType gguf_weight_type(const GgufFile& f);
// What config.json cannot say, set on the parsed config: the weight type (and
// a mixed file's byte scale and head type), and llama.cpp's rope_freqs
// divisors (Llama 3.1 rope scaling) on the frequencies.
core::Status gguf_adjust_config(const GgufFile& f, ModelConfig& c);

// One tensor under its Hugging Face name, as TensorStore hands it out.
struct GgufMapped {
  std::string hf_name;
  core::Shape shape;           // the Hugging Face shape
  std::string gguf_name;
  enum class Layout { kAsIs, kTranspose, kUnpermute } layout = Layout::kAsIs;
  int64_t heads = 0;           // kUnpermute: the heads whose rows llama.cpp interleaved
};
core::Result<std::vector<GgufMapped>> gguf_tensor_map(const GgufFile& f);
// The tensor in its Hugging Face layout, F32.
core::Result<core::Tensor> gguf_read(const GgufFile& f, const GgufMapped& m);
// A matrix as the file's own blocks (Q8_0, Q4_0, Q4_K, Q6_K), in Linear
// layout [out, in]: the Hugging Face tensor's rows, llama.cpp's Q/K
// interleave undone on a copy (it moves whole rows); for GPT-2's Conv1D
// tensors (kTranspose) the file's rows, which are the Hugging Face columns.
// nullopt for other types. Loading copies these blocks as they are:
// requantising widened K-quant blocks would not give them back.
struct GgufBlocks {
  kernels::WeightType type = kernels::WeightType::kF32;
  int64_t rows = 0, k = 0;
  const uint8_t* data = nullptr;      // rows * row_bytes(type, k) bytes
  std::shared_ptr<const void> keep;   // the copy `data` points into, if any
};
core::Result<std::optional<GgufBlocks>> gguf_blocks(const GgufFile& f, const GgufMapped& m);

// tokenizer.ggml.model "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen2/3).
core::Result<std::unique_ptr<Tokenizer>> gguf_tokenizer(const GgufFile& f);
// tokenizer.chat_template, or not_found.
core::Result<std::string> gguf_chat_template(const GgufFile& f);

// `tessera quantize`: a Hugging Face folder (GPT-2, Llama, Mistral, Qwen2,
// Qwen3) written as a GGUF file llama.cpp loads. 2-D weight matrices are
// held in `type` (f32, f16, q8_0, q4_0, q4_k, q6_k, or q4_k_m: llama.cpp's
// mix of Q4_K and Q6_K); a matrix whose rows are not whole blocks falls back
// (K-quants to Q8_0, then F16, as llama.cpp's quantizer falls back), GPT-2's
// position table and every norm and bias stay F32. `notes` hears of each fallback.
struct QuantizeReport {
  int64_t tensors = 0, quantized = 0;
  std::map<std::string, int64_t> types;  // quantized matrices by GGUF type name
  std::vector<std::string> notes;
  size_t bytes = 0;
};
core::Result<QuantizeReport> write_gguf_model(const std::string& model_dir, const std::string& type, const std::string& out);

}  // namespace tessera::model
