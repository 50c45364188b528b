# Shared by setup.sh and setup_tf.sh (sourced): what building Horovod from
# source needs from Debian. Needs PY and the scripts' say/die.

# ensure_build_prereqs [PKG...]: installs g++, make, python3, python3-venv,
# python3-dev (whichever are missing) and the given packages with apt-get when
# run as root, else stops saying what to install.
ensure_build_prereqs() {
  local need_pkgs=("$@")
  command -v g++ >/dev/null || need_pkgs+=(g++)
  command -v make >/dev/null || need_pkgs+=(make)
  [ -x "$PY" ] || need_pkgs+=(python3)
  "$PY" -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
  [ -n "$("$PY" -c 'import sysconfig; import os; print(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) or "")' 2>/dev/null)" ] \
    || need_pkgs+=(python3-dev)
  [ ${#need_pkgs[@]} -gt 0 ] || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${need_pkgs[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" \
      || die "apt-get install ${need_pkgs[*]} failed"
  else
    die "missing ${need_pkgs[*]}: install them (apt-get install -y ${need_pkgs[*]}) and rerun"
  fi
}
