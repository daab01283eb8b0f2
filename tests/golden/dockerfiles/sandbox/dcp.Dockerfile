FROM sandbox-vllm
# sparkstack stage dcp: the SM120 sparse-MLA backend with decode-context-parallel, so the KV cache
# is sharded across the four ranks instead of replicated (1M tokens instead of ~300K).
COPY files/ /tmp/sparkstack-dcp/
RUN set -eu; \
    origin() { python3 -c 'import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); sys.exit("python3 cannot find " + sys.argv[1] + " in the base image") if s is None or not s.origin else print(s.origin)' "$1"; }; \
    put() { d="${2%/*}"; \
        [ -d "$d" ] || { echo "sparkstack stage dcp: $d is missing in the base image (another vLLM layout?)" >&2; exit 1; }; \
        [ "$3" = add ] || [ -f "$2" ] || { echo "sparkstack stage dcp: $2 is missing in the base image, and $1 is an overlay of it" >&2; exit 1; }; \
        cp "$1" "$2"; chmod 0644 "$2"; echo "sparkstack stage dcp: $2 ($3)"; }; \
    o="$(origin vllm)"; vllm_dir="${o%/*}"; \
    put /tmp/sparkstack-dcp/sm120_dcp.py "${vllm_dir}/v1/attention/backends/mla/sm120_dcp.py" add; \
    put /tmp/sparkstack-dcp/mla_attn_dcp.py "${vllm_dir}/v1/attention/backends/mla/mla_attn_dcp.py" add; \
    rm -rf /tmp/sparkstack-dcp
