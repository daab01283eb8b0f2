FROM sparkstack/dcp:925de1483af8e0c2
# sparkstack stage mul1: the EXL3 overlay that reads mul1 (and mcg) codebooks per layer and leaves
# the MTP block to the stock bf16 path.
COPY files/ /tmp/sparkstack-mul1/
RUN set -eu; \
    origin() { python3 -c 'import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); sys.exit("python3 cannot find " + sys.argv[1] + " in the base image") if s is None or not s.origin else print(s.origin)' "$1"; }; \
    put() { d="${2%/*}"; \
        [ -d "$d" ] || { echo "sparkstack stage mul1: $d is missing in the base image (another vLLM layout?)" >&2; exit 1; }; \
        [ "$3" = add ] || [ -f "$2" ] || { echo "sparkstack stage mul1: $2 is missing in the base image, and $1 is an overlay of it" >&2; exit 1; }; \
        cp "$1" "$2"; chmod 0644 "$2"; echo "sparkstack stage mul1: $2 ($3)"; }; \
    o="$(origin vllm)"; vllm_dir="${o%/*}"; \
    put /tmp/sparkstack-mul1/exl3.py "${vllm_dir}/model_executor/layers/quantization/exl3.py" replace; \
    rm -rf /tmp/sparkstack-mul1
