FROM sparkstack/v145:a9786c4be23de622
# sparkstack stage keys: the sparse-attention indexer whose prefill top-k falls back when
# persistent_topk would oversubscribe the GB10's 48 SMs.
COPY files/ /tmp/sparkstack-keys/
RUN set -eu; \
    origin() { python3 -c 'import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); sys.exit("python3 cannot find " + sys.argv[1] + " in the base image") if s is None or not s.origin else print(s.origin)' "$1"; }; \
    put() { d="${2%/*}"; \
        [ -d "$d" ] || { echo "sparkstack stage keys: $d is missing in the base image (another vLLM layout?)" >&2; exit 1; }; \
        [ "$3" = add ] || [ -f "$2" ] || { echo "sparkstack stage keys: $2 is missing in the base image, and $1 is an overlay of it" >&2; exit 1; }; \
        cp "$1" "$2"; chmod 0644 "$2"; echo "sparkstack stage keys: $2 ($3)"; }; \
    o="$(origin vllm)"; vllm_dir="${o%/*}"; \
    put /tmp/sparkstack-keys/sparse_attn_indexer.py "${vllm_dir}/model_executor/layers/sparse_attn_indexer.py" replace; \
    rm -rf /tmp/sparkstack-keys
