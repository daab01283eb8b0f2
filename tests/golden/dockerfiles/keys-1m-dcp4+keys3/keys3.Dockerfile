FROM sparkstack/keys:2e54b5b8c00f2af6
# sparkstack stage keys3: the optional ablit hook. Installed inert: it does nothing unless the
# launcher points it at donor weights (ABLIT_HOST_DIR), so the image serves the same model.
COPY files/ /tmp/sparkstack-keys3/
RUN set -eu; \
    origin() { python3 -c 'import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); sys.exit("python3 cannot find " + sys.argv[1] + " in the base image") if s is None or not s.origin else print(s.origin)' "$1"; }; \
    put() { d="${2%/*}"; \
        [ -d "$d" ] || { echo "sparkstack stage keys3: $d is missing in the base image (another vLLM layout?)" >&2; exit 1; }; \
        [ "$3" = add ] || [ -f "$2" ] || { echo "sparkstack stage keys3: $2 is missing in the base image, and $1 is an overlay of it" >&2; exit 1; }; \
        cp "$1" "$2"; chmod 0644 "$2"; echo "sparkstack stage keys3: $2 ($3)"; }; \
    o="$(origin vllm)"; vllm_dir="${o%/*}"; \
    put /tmp/sparkstack-keys3/ablit_runtime.py "${vllm_dir}/model_executor/models/ablit_runtime.py" add; \
    true
RUN set -eu; \
    origin() { python3 -c 'import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); sys.exit("python3 cannot find " + sys.argv[1] + " in the base image") if s is None or not s.origin else print(s.origin)' "$1"; }; \
    o="$(origin vllm)"; model="${o%/*}/model_executor/models/deepseek_v2.py"; \
    [ -f "$model" ] || { echo "sparkstack stage keys3: $model is missing in the base image" >&2; exit 1; }; \
    python3 /tmp/sparkstack-keys3/patch_ablit_dsv2.py "$model"; \
    rm -rf /tmp/sparkstack-keys3
