#pragma once

// engine/model: a loaded GGUF model, its vocabulary and metadata.

#include "base/types.h"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <vector>

struct llama_model;
struct llama_vocab;
class llama_opt_grammar_vocab;

struct llama_opt_model_params {
    bool use_mmap = true;
    // Called with the load progress in [0, 1]; returning false cancels the load.
    std::function<bool(float)> on_progress;
};

// Q5_0 weights held as Q8_0 blocks (patches/0016, on by default) for the models loaded after this
// call; off only to measure the difference side by side.
void llama_opt_set_q5_0_widened(bool on);

class llama_opt_model {
public:
    // Throws llama_opt_error(model_load) with a message that says what to do.
    llama_opt_model(const std::string & path, const llama_opt_model_params & params);
    ~llama_opt_model();

    llama_opt_model(const llama_opt_model &)             = delete;
    llama_opt_model & operator=(const llama_opt_model &) = delete;

    llama_model *       get() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    const std::string & path() const { return path_; }
    // The file as it was when loading began: whoever keys data by the file's content (the
    // persistent KV cache) checks that the file at path() is still this one.
    const struct stat & file_stat() const { return file_stat_; }

    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string              token_piece(llama_token token, bool special) const;  // raw bytes
    std::string              detokenize(const std::vector<llama_token> & tokens, bool remove_special,
                                        bool unparse_special) const;

    // Throws llama_opt_error(invalid_token) naming the first token outside the vocabulary.
    void check_tokens(const llama_token * tokens, size_t n) const;

    int32_t n_vocab() const;
    int32_t n_ctx_train() const;
    int32_t n_layer() const;
    int32_t n_embd() const;
    int32_t n_head() const;
    int32_t n_head_kv() const;
    int32_t n_swa() const;  // sliding-window size, 0 if the model has none
    uint64_t n_params() const;
    uint64_t kv_bytes_per_token() const;  // K and V of one token over all layers, in F16
    std::pair<uint32_t, uint32_t> head_dims() const;  // K and V dimension of one attention head
    uint64_t size_bytes() const;

    llama_token bos() const;
    llama_token eos() const;
    bool        add_bos() const;  // whether tokenize(add_special=true) prepends BOS
    bool        is_eog(llama_token token) const;

    std::string                        description() const;
    std::map<std::string, std::string> metadata() const;
    std::string                        meta(const std::string & key) const;  // "" if absent
    std::string                        chat_template() const;               // "" if none

    // What grammars learned about this vocabulary (methods/grammar), made on first use.
    std::shared_ptr<llama_opt_grammar_vocab> grammar_vocab() const;

private:
    std::string         path_;
    struct stat         file_stat_ {};
    llama_model *       model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;

    mutable std::once_flag                           grammar_vocab_once_;
    mutable std::shared_ptr<llama_opt_grammar_vocab> grammar_vocab_;
};
