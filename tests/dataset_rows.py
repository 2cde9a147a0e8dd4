"""Small synthetic rows in each benchmark source's real schema (the HF datasets z-lab loads), for tests that
need the sets no package ships (and short stand-ins for the two that do), and z-lab's formatting as
``dflash/benchmark.py`` writes it, transcribed from reading that file (its ``DATASETS[name]["format"]``)."""

from __future__ import annotations

import json
from pathlib import Path

# openai/gsm8k (main): question, answer
GSM8K = [{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
          "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
         {"question": "A train travels 60 km in 1.5 hours. What is its speed in km/h?",
          "answer": "60 / 1.5 = <<60/1.5=40>>40\n#### 40"}]
# HuggingFaceH4/MATH-500: problem, solution, answer, subject, level, unique_id
MATH500 = [{"problem": "Compute $\\dbinom{8}{4}$.", "solution": "$\\dbinom{8}{4} = \\boxed{70}$.", "answer": "70",
            "subject": "Counting & Probability", "level": 2, "unique_id": "test/counting_and_probability/1.json"},
           {"problem": "What is $\\sqrt{49}+{1}$?", "solution": "$7+1=\\boxed{8}$", "answer": "8",
            "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/7.json"}]
# google-research-datasets/mbpp (sanitized): source_file, task_id, prompt, code, test_imports, test_list
MBPP = [{"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 2,
         "prompt": "Write a function to find the shared elements from the given two lists.",
         "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))", "test_imports": [],
         "test_list": ["assert set(similar_elements((3, 4), (4, 5))) == set((4,))"]},
        {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 3,
         "prompt": "Write a python function to identify non-prime numbers.",
         "code": "def is_not_prime(n):\n    return any(n % i == 0 for i in range(2, n))", "test_imports": [],
         "test_list": ["assert is_not_prime(2) == False"]}]
# openai/openai_humaneval: task_id, prompt, canonical_solution, test, entry_point
HUMANEVAL = [{"task_id": "HumanEval/0", "prompt": "def add(a: int, b: int) -> int:\n    \"\"\"Add two numbers.\"\"\"\n",
              "canonical_solution": "    return a + b\n", "test": "def check(f):\n    assert f(1, 2) == 3\n",
              "entry_point": "add"},
             {"task_id": "HumanEval/1", "prompt": "def neg(a: int) -> int:\n    \"\"\"Negate {a}.\"\"\"\n",
              "canonical_solution": "    return -a\n", "test": "def check(f):\n    assert f(1) == -1\n",
              "entry_point": "neg"}]
# HuggingFaceH4/mt_bench_prompts: prompt (the turns), prompt_id, category, reference
MT_BENCH = [{"prompt": ["Write a haiku about the sea.", "Now make it rhyme."], "prompt_id": 81,
             "category": "writing", "reference": []},
            {"prompt": ["What is 12 * 7?", "And divided by 4?"], "prompt_id": 111, "category": "math",
             "reference": ["84", "21"]}]

ROWS = {"gsm8k": GSM8K, "math500": MATH500, "mbpp": MBPP, "humaneval": HUMANEVAL, "mt-bench": MT_BENCH}

# dflash/benchmark.py, DATASETS[name]["format"], as written there (the mt-bench rows' turns are x["prompt"]).
ZLAB_FORMAT = {
    "gsm8k": lambda x: "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.".format(**x),  # noqa: E501
    "math500": lambda x: "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.".format(**x),  # noqa: E501
    "humaneval": lambda x: "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```".format(**x),  # noqa: E501
    "mbpp": lambda x: x["prompt"],
    "mt-bench": lambda x: x["prompt"],
}


def zlab_turns(name: str, row: dict) -> list[str]:
    """dflash/benchmark.py's _prepare_dataset: [format(row)], or format(row) itself for the multi-turn set."""
    return ZLAB_FORMAT[name](row) if name == "mt-bench" else [ZLAB_FORMAT[name](row)]


def write_sets(folder: Path, names=tuple(ROWS)) -> dict[str, Path]:
    """Each set as the JSON lines `Dataset.to_json` writes; returns NAME -> file."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        out[name] = folder / f"{name}-test.jsonl"
        out[name].write_text("".join(json.dumps(r) + "\n" for r in ROWS[name]), encoding="utf-8")
    return out
