"""Everything the library saves and reads back, below every other package.

- `atomic`: files written under a temporary name, fsynced and renamed (readers never see half a file);
- `checkpoint`: Lightning checkpoints read as tensors and plain values only;
- `registry`: constructor configs (``class_path`` / ``init_args``) and the classes they may build.
"""
