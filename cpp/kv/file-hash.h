#pragma once

// kv/file-hash: a model's identity for the disk tier (an entry names the weights its KV
// was computed with): the checksum of the model file's content, remembered per file version.

#include <cstdint>
#include <string>
#include <sys/stat.h>

// The checksum of a file's whole content (weights and metadata, not its name). Remembered in memo_dir/file-hashes by (path, device, inode, size, mtime, ctime), so that
// a large model is read once per version, not once per process. ctime is there because tools
// that copy a file may restore its mtime, but nothing can set ctime back; a file written just before
// it was read is not remembered (its times could stay the same through another write). `loaded`: the file as the
// model was loaded from it (its stat); a file at `path` that is no longer that one (replaced, or
// written since) throws, as its content would name KV computed with other weights. Throws
// std::runtime_error if the file cannot be read.
uint64_t llama_opt_file_hash(const std::string & path, const std::string & memo_dir, const struct stat & loaded);

// Whether two stats are of the same file in the same version (device, inode, size, mtime, ctime).
bool llama_opt_same_file_version(const struct stat & a, const struct stat & b);
