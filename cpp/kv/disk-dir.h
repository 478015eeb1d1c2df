#pragma once

// kv/disk-dir: where the disk tier lives, and whether it is safe to use: a
// directory only this user can write (docs/persist-format.md, threat model).

#include <string>

// Checks that dir is a directory of this user's that no other user can write (a writer there
// can plant KV that passes every checksum: integrity is not authenticity), as OpenSSH does for
// key directories; one readable by others (0755, from older versions) is tightened to 0700.
// False, and why (with what to do), otherwise.
bool llama_opt_persist_check_dir(const std::string & dir, std::string & why);

// Creates dir and its missing parents (0700: the entries hold prompts' token ids in plain) if
// it is missing, then llama_opt_persist_check_dir.
bool llama_opt_persist_prepare_dir(const std::string & dir, std::string & why);

// The default directory: $XDG_CACHE_HOME/pyllamaopt/kv (an absolute one), else ~/.cache/pyllamaopt/kv
// ($HOME, else the account's home), else /tmp/pyllamaopt-<uid>/kv.
std::string llama_opt_persist_default_dir();
