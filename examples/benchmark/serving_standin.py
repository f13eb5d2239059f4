"""A stand-in for a serving benchmark that is not a pytest test, such as SGLang's
``python -m sglang.bench_serving`` (vLLM's ``benchmarks/benchmark_serving.py`` and NCCL's tests
are alike): it takes ``--num-prompts`` and ``--output-file`` and appends one JSON line of
results to that file, as bench_serving does. It "serves" on the CPU (a hash per token), so the
example runs anywhere; test_serving.py runs the real one instead when told to.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--output-len", type=int, default=64, help="tokens per answer")
    parser.add_argument("--output-file", required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    token = b"prompt"
    for _ in range(args.num_prompts * args.output_len):
        token = hashlib.sha256(token).digest()  # one "decode step"
    duration = time.perf_counter() - start
    tokens = args.num_prompts * args.output_len
    result = {"backend": "cpu-standin", "completed": args.num_prompts, "duration": duration,
              "total_output_tokens": tokens, "output_throughput": tokens / duration,
              "request_throughput": args.num_prompts / duration}
    with open(args.output_file, "a", encoding="utf-8") as out:
        out.write(json.dumps(result) + "\n")
    print(f"{tokens / duration:.0f} output tokens/s over {args.num_prompts} prompts")


if __name__ == "__main__":
    main()
