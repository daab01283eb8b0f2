FROM sparkstack/mul1:24c389fcc95f0425
# sparkstack stage v145: exllamav3 1.4.5's extension over the image's 0.0.43 one (its exl3_moe
# kernel hard-rejects mul1). Same signature, same torch: only the shared object changes, so it is
# checked to be one (an ELF file) and written over whatever file the base loads the module from.
ARG EXT_MODULE=exllamav3_ext
COPY files/ /tmp/sparkstack-v145/
RUN set -eu; \
    origin() { python3 -c 'import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); sys.exit("python3 cannot find " + sys.argv[1] + " in the base image") if s is None or not s.origin else print(s.origin)' "$1"; }; \
    so="$(origin "$EXT_MODULE")"; \
    case "$so" in *.so) ;; *) echo "sparkstack stage v145: $EXT_MODULE loads from $so, not a compiled extension" >&2; exit 1;; esac; \
    new=/tmp/sparkstack-v145/exllamav3_ext.so; \
    [ "$(dd if="$new" bs=1 skip=1 count=3 2>/dev/null)" = ELF ] || { echo "sparkstack stage v145: exllamav3_ext.so is not an ELF shared object (a wheel? unpack it and give the .so)" >&2; exit 1; }; \
    cp "$new" "$so"; chmod 0755 "$so"; echo "sparkstack stage v145: $so"; \
    rm -rf /tmp/sparkstack-v145
