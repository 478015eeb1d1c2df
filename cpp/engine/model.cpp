#include "engine/model.h"

#include "base/numerics.h"
#include "engine/log.h"
#include "ggml-cpu.h"
#include "llama.h"
#include "methods/grammar-vocab.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sys/stat.h>

static void backend_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_opt_log_init();
        llama_backend_init();
        // a decode step's attention must not depend on other sessions' cells (patches/0003)
        ggml_cpu_set_flash_attn_kv_tile(LLAMA_OPT_FA_KV_TILE);
        // a small batch's rows compute like one-token steps: the memo checks drafts exactly (patches/0006)
        ggml_cpu_set_row_invariant_batch(LLAMA_OPT_ROW_INVARIANT_BATCH);
        // prefill attention converts each K/V tile once for the query heads sharing it: the same bits,
        // faster (patches/0014)
        ggml_cpu_set_flash_attn_shared_kv_tiles(1);
        // Q5_0 weights held as Q8_0 blocks with the same integers: the same bits, Q8_0's faster
        // kernels (patches/0016); before any model is loaded, since it decides where weights go
        ggml_cpu_set_q5_0_widened(1);
        // Q4_1 batches unpack each weight block once for 16 rows: the same bits, faster (patches/0020)
        ggml_cpu_set_q4_1_rows(1);
    });
}

void llama_opt_set_q5_0_widened(bool on) {
    backend_init();  // which turns it on
    ggml_cpu_set_q5_0_widened(on ? 1 : 0);
}

// Checks what llama.cpp would report only as "failed to load": missing, a folder,
// unreadable, not GGUF. Throws with an actionable message.
static void check_model_file(const std::string & path) {
    auto fail = [&](const std::string & why) {
        throw llama_opt_error(llama_opt_errc::model_load, "cannot load model '" + path + "': " + why, path);
    };
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        fail(std::string(strerror(errno)) + " (give the path of a .gguf file, or a model name such as 'gemma3-270m')");
    }
    if (S_ISDIR(st.st_mode)) {
        fail("it is a directory; give the path of the .gguf file inside it");
    }
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {};
    if (!in) {
        fail(std::string("cannot open it: ") + strerror(errno));
    }
    if (!in.read(magic, sizeof(magic))) {
        fail("file is too short to be a GGUF model (" + std::to_string(in.gcount()) + " bytes)");
    }
    if (memcmp(magic, "GGUF", 4) != 0) {
        fail("not a GGUF file (it does not start with 'GGUF'); convert the model with llama.cpp's convert_hf_to_gguf.py");
    }
}

llama_opt_model::llama_opt_model(const std::string & path, const llama_opt_model_params & params) : path_(path) {
    backend_init();
    check_model_file(path);
    if (stat(path.c_str(), &file_stat_) != 0) {
        throw llama_opt_error(llama_opt_errc::model_load, "cannot read model '" + path + "': " + std::strerror(errno), path);
    }

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers       = 0;
    mp.load_mode          = params.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    if (params.on_progress) {
        mp.progress_callback           = [](float p, void * ud) { return (*static_cast<const std::function<bool(float)> *>(ud))(p); };
        mp.progress_callback_user_data = const_cast<std::function<bool(float)> *>(&params.on_progress);
    }
    llama_opt_log_take_errors();
    model_ = llama_model_load_from_file(path.c_str(), mp);
    if (!model_) {
        std::string why = llama_opt_log_take_errors();
        throw llama_opt_error(llama_opt_errc::model_load,
            "cannot load model '" + path + "': llama.cpp rejected it" + (why.empty() ? "" : ":\n" + why) +
            "\nThe file may be truncated, corrupt, or of an architecture this llama.cpp does not know.", path);
    }
    vocab_ = llama_model_get_vocab(model_);
}

llama_opt_model::~llama_opt_model() {
    llama_model_free(model_);
}

std::vector<llama_token> llama_opt_model::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    if (text.size() > (size_t) INT32_MAX / 2) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, "text too long to tokenize");
    }
    std::vector<llama_token> tokens(text.size() + 2);
    int32_t n = llama_tokenize(vocab_, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
                               add_special, parse_special);
    if (n < 0) {
        tokens.resize(-n);
        n = llama_tokenize(vocab_, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
                           add_special, parse_special);
    }
    if (n < 0) {
        throw llama_opt_error(llama_opt_errc::invalid_argument, "tokenization failed");
    }
    tokens.resize(n);
    return tokens;
}

std::string llama_opt_model::token_piece(llama_token token, bool special) const {
    check_tokens(&token, 1);
    char buf[128];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, special);
    if (n >= 0) {
        return std::string(buf, n);
    }
    std::string piece(-n, '\0');
    n = llama_token_to_piece(vocab_, token, piece.data(), (int32_t) piece.size(), 0, special);
    piece.resize(std::max<int32_t>(n, 0));
    return piece;
}

std::string llama_opt_model::detokenize(const std::vector<llama_token> & tokens, bool remove_special, bool unparse_special) const {
    check_tokens(tokens.data(), tokens.size());
    std::string text(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), text.data(), (int32_t) text.size(),
                                 remove_special, unparse_special);
    if (n < 0) {
        text.resize(-n);
        n = llama_detokenize(vocab_, tokens.data(), (int32_t) tokens.size(), text.data(), (int32_t) text.size(),
                             remove_special, unparse_special);
    }
    text.resize(std::max<int32_t>(n, 0));
    return text;
}

void llama_opt_model::check_tokens(const llama_token * tokens, size_t n) const {
    const int32_t n_vocab = llama_vocab_n_tokens(vocab_);
    for (size_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            throw llama_opt_error(llama_opt_errc::invalid_token,
                "token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                " is outside the vocabulary (valid ids: 0.." + std::to_string(n_vocab - 1) + ")");
        }
    }
}

int32_t  llama_opt_model::n_vocab() const     { return llama_vocab_n_tokens(vocab_); }
int32_t  llama_opt_model::n_ctx_train() const { return llama_model_n_ctx_train(model_); }
int32_t  llama_opt_model::n_layer() const     { return llama_model_n_layer(model_); }
int32_t  llama_opt_model::n_embd() const      { return llama_model_n_embd(model_); }
int32_t  llama_opt_model::n_head() const      { return llama_model_n_head(model_); }
int32_t  llama_opt_model::n_head_kv() const   { return llama_model_n_head_kv(model_); }
int32_t  llama_opt_model::n_swa() const       { return llama_model_n_swa(model_); }
uint64_t llama_opt_model::n_params() const    { return llama_model_n_params(model_); }

std::pair<uint32_t, uint32_t> llama_opt_model::head_dims() const {
    const std::string arch = meta("general.architecture");
    const uint32_t    dflt = (uint32_t) (n_embd() / std::max(1, n_head()));
    auto dim = [&](const char * key) {
        const std::string v = meta(arch + ".attention." + key);
        return v.empty() ? dflt : (uint32_t) std::stoul(v);
    };
    return { dim("key_length"), dim("value_length") };
}

uint64_t llama_opt_model::kv_bytes_per_token() const {
    const auto dims = head_dims();
    return (uint64_t) n_layer() * (uint64_t) n_head_kv() * (dims.first + dims.second) * 2;
}
uint64_t llama_opt_model::size_bytes() const  { return llama_model_size(model_); }

llama_token llama_opt_model::bos() const                    { return llama_vocab_bos(vocab_); }
llama_token llama_opt_model::eos() const                    { return llama_vocab_eos(vocab_); }
bool        llama_opt_model::add_bos() const                { return llama_vocab_get_add_bos(vocab_); }
bool llama_opt_model::is_eog(llama_token token) const {
    check_tokens(&token, 1);
    return llama_vocab_is_eog(vocab_, token);
}

std::shared_ptr<llama_opt_grammar_vocab> llama_opt_model::grammar_vocab() const {
    std::call_once(grammar_vocab_once_, [this] { grammar_vocab_ = std::make_shared<llama_opt_grammar_vocab>(vocab_); });
    return grammar_vocab_;
}

std::string llama_opt_model::description() const {
    char buf[256];
    const int32_t n = llama_model_desc(model_, buf, sizeof(buf));
    return std::string(buf, std::max<int32_t>(0, std::min<int32_t>(n, sizeof(buf) - 1)));
}

// Reads one metadata string through llama.cpp's size-returning getter.
template <typename F>
static std::string read_meta_string(F && get) {
    std::string value(256, '\0');
    int32_t n = get(value.data(), value.size());
    if (n < 0) {
        return "";
    }
    if ((size_t) n >= value.size()) {
        value.resize(n + 1);
        n = get(value.data(), value.size());
    }
    value.resize(n);
    return value;
}

std::map<std::string, std::string> llama_opt_model::metadata() const {
    std::map<std::string, std::string> out;
    const int32_t count = llama_model_meta_count(model_);
    for (int32_t i = 0; i < count; ++i) {
        const std::string key = read_meta_string([&](char * b, size_t n) { return llama_model_meta_key_by_index(model_, i, b, n); });
        out[key] = read_meta_string([&](char * b, size_t n) { return llama_model_meta_val_str_by_index(model_, i, b, n); });
    }
    return out;
}

std::string llama_opt_model::meta(const std::string & key) const {
    return read_meta_string([&](char * b, size_t n) { return llama_model_meta_val_str(model_, key.c_str(), b, n); });
}

std::string llama_opt_model::chat_template() const {
    const char * tmpl = llama_model_chat_template(model_, nullptr);
    return tmpl ? tmpl : "";
}
