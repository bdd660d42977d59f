# Sourced by the setup scripts: `editable_lock CMD...` runs CMD holding an exclusive lock on
# .setup-editable.lock in the checkout. The main and the side environments are set up at the same time,
# and each editable install of this checkout rewrites its rlhf_ext.egg-info: they take turns. Without
# flock (not a Linux userland) CMD runs unlocked, as before the environments were set up in parallel.
editable_lock() {
  if command -v flock >/dev/null 2>&1; then
    (
      flock -w 900 9 || { echo "setup: waited 900 s for .setup-editable.lock (another setup running?)" >&2; exit 1; }
      "$@"
    ) 9>.setup-editable.lock
  else
    "$@"
  fi
}
