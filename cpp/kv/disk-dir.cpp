#include "kv/disk-dir.h"

#include "kv/disk-io.h"

#include <cerrno>
#include <cstdlib>

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

std::string llama_opt_persist_default_dir() {
    const char * xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') {  // the XDG spec: a relative path is ignored
        return std::string(xdg) + "/pyllamaopt/kv";
    }
    const char * home = getenv("HOME");
    std::string  base = home && home[0] == '/' ? home : "";
    if (base.empty()) {  // a service without HOME: the account's home
        const passwd * pw = getpwuid(geteuid());
        base = pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : "";
    }
    if (base.empty() || base == "/") {  // no home of its own: not a directory others share (/tmp/.cache)
        return "/tmp/pyllamaopt-" + std::to_string(geteuid()) + "/kv";
    }
    return base + "/.cache/pyllamaopt/kv";
}

bool llama_opt_persist_prepare_dir(const std::string & dir, std::string & why) {
    std::string path;
    for (size_t i = 0; i <= dir.size(); ++i) {
        if (i == dir.size() || (dir[i] == '/' && i > 0)) {
            path = dir.substr(0, i);
            if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
                why = llama_opt_errno_text("cannot create " + path) + "; set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory you can write";
                return false;
            }
        }
    }
    return llama_opt_persist_check_dir(dir, why);
}

bool llama_opt_persist_check_dir(const std::string & dir, std::string & why) {
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) {
        why = llama_opt_errno_text("cannot use " + dir) + "; set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory you can write";
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        why = dir + " is not a directory; remove it or set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory";
        return false;
    }
    if (st.st_uid != geteuid()) {
        why = dir + " is owned by another user (uid " + std::to_string(st.st_uid) + "): whoever owns it can plant KV "
              "that passes every checksum; set LLAMA_OPT_PERSIST_DIR (persist_dir) to a directory of your own";
        return false;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        why = dir + " is writable by other users: they could plant KV that passes every checksum; "
              "run `chmod 700 " + dir + "` (and clear it with `pyllamaopt cache clean --all --dir " + dir + "` if you do not trust it)";
        return false;
    }
    if ((st.st_mode & 0077) != 0 && chmod(dir.c_str(), 0700) != 0) {
        // readable by others (0755 from older versions): ours, so tightened, since the entries hold prompts
        why = llama_opt_errno_text("cannot make " + dir + " private") + "; run `chmod 700 " + dir + "`";
        return false;
    }
    return true;
}
