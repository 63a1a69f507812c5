"""The prompt corpora the training tools answer with the target: never benchmark data.

The draft model (`distill.py`) and the draft head (`head_data.py`) learn from the target's answers
to instructions built here, offline and deterministically, from two sources:

* the Python standard library: the first docstring line of public functions and classes turned
  into coding requests ("Write a Python function ...", "Explain what `mod.func` does ...") and
  module docstrings turned into translation, summarisation, passage-QA and tutorial requests;
* hand-written lists: everyday and technical topics crossed with task templates (explain, tips,
  story, email, comparison, ...), and arithmetic word problems with random numbers.

None of it comes from MT-Bench, HumanEval or Spec-Bench, the sets the project evaluates on
(`bench/prompts.py`). `distill_prompts` is the draft model's pool, `head_prompts` the draft head's
(the same sources plus the task prompts). Each is de-duplicated and shuffled by its seed: the same
seed gives the same prompts on the same Python version (`tests/test_corpus.py` pins them; the
docstrings differ between Python versions). The shipped draft and head were trained on these pools.
"""

from __future__ import annotations

import importlib
import inspect
import random
import sys
from types import ModuleType

STDLIB_MODULES = [
    "os",
    "os.path",
    "json",
    "re",
    "itertools",
    "collections",
    "functools",
    "math",
    "statistics",
    "string",
    "textwrap",
    "pathlib",
    "shutil",
    "datetime",
    "random",
    "heapq",
    "bisect",
    "operator",
    "fractions",
    "decimal",
    "glob",
    "fnmatch",
    "difflib",
    "base64",
    "hashlib",
    "hmac",
    "zlib",
    "gzip",
    "csv",
    "calendar",
    "copy",
    "pprint",
    "urllib.parse",
    "html",
    "uuid",
    "secrets",
    "tempfile",
    "time",
    "struct",
    "binascii",
    "ipaddress",
    "unicodedata",
    "shlex",
    "cmath",
    "colorsys",
    "keyword",
    "linecache",
    "locale",
    "platform",
    "zipfile",
    "tarfile",
    "logging",
    "contextlib",
    "dataclasses",
    "enum",
    "inspect",
    "typing",
    "array",
    "queue",
    "threading",
    "email.utils",
    "http.cookies",
    "mimetypes",
    "quopri",
    "wave",
    "graphlib",
    "numbers",
    "io",
]

CODE_TEMPLATES = [
    "Write a Python function for the following task, with a short docstring: {line}",
    "Explain what `{qual}` does in Python and show a short example.",
    "Implement from scratch (without using `{qual}`) a Python function that does this: {line}",
    "I found `{qual}` in some code. What is it for, and when should I use it?",
]

TOPICS = [
    "photosynthesis",
    "black holes",
    "the water cycle",
    "climate change",
    "volcanoes",
    "earthquakes",
    "the immune system",
    "vaccines",
    "sleep",
    "meditation",
    "running a marathon",
    "learning a new language",
    "the French Revolution",
    "the Roman Empire",
    "ancient Egypt",
    "the printing press",
    "the Industrial Revolution",
    "the Renaissance",
    "World War I",
    "the Cold War",
    "the Moon landing",
    "the internet",
    "electric cars",
    "solar power",
    "wind energy",
    "nuclear power",
    "recycling",
    "composting",
    "urban gardening",
    "beekeeping",
    "coffee",
    "tea",
    "bread baking",
    "fermentation",
    "vegetarian cooking",
    "meal planning",
    "budgeting",
    "saving for retirement",
    "compound interest",
    "inflation",
    "the stock market",
    "cryptocurrency",
    "starting a small business",
    "remote work",
    "job interviews",
    "writing a resume",
    "public speaking",
    "time management",
    "procrastination",
    "habits",
    "friendship",
    "parenting",
    "adopting a dog",
    "cats",
    "birdwatching",
    "hiking",
    "camping",
    "traveling to Japan",
    "visiting Paris",
    "road trips",
    "photography",
    "painting with watercolors",
    "learning the guitar",
    "jazz",
    "classical music",
    "chess",
    "board games",
    "video game design",
    "machine learning",
    "neural networks",
    "databases",
    "cloud computing",
    "cybersecurity",
    "passwords",
    "open source software",
    "version control with git",
    "unit testing",
    "recursion",
    "sorting algorithms",
    "binary search",
    "hash tables",
    "linked lists",
    "graph algorithms",
    "regular expressions",
    "the Linux command line",
    "Docker containers",
    "web development",
    "HTML and CSS",
    "JavaScript",
    "Python programming",
    "SQL queries",
    "APIs",
    "spreadsheets",
    "data visualization",
    "statistics",
    "probability",
    "prime numbers",
    "the Pythagorean theorem",
    "fractions",
    "calculus",
    "geometry",
    "the solar system",
    "Mars exploration",
    "the ocean",
    "coral reefs",
    "rainforests",
    "deserts",
    "glaciers",
    "dinosaurs",
    "evolution",
    "DNA",
    "genetics",
    "the human brain",
    "the heart",
    "nutrition",
    "vitamins",
    "drinking water",
    "first aid",
    "yoga",
    "strength training",
    "swimming",
    "cycling to work",
    "soccer",
    "basketball",
    "the Olympic Games",
    "mountains",
    "rivers",
    "weather forecasting",
    "rainbows",
    "lightning",
    "magnets",
    "electricity",
    "gravity",
    "light",
    "sound",
    "atoms",
    "chemical reactions",
    "plastics",
    "batteries",
    "3D printing",
    "robots",
    "self-driving cars",
    "smartphones",
    "social media",
    "online privacy",
    "misinformation",
    "libraries",
    "reading more books",
    "writing poetry",
    "keeping a journal",
    "minimalism",
    "moving to a new city",
    "renting an apartment",
    "home repairs",
    "houseplants",
    "cleaning the house",
    "wedding planning",
    "birthday parties",
    "volunteering",
    "democracy",
    "elections",
    "taxes",
    "the history of money",
    "trade",
    "supply chains",
    "airplanes",
    "trains",
    "bicycles",
    "bridges",
    "skyscrapers",
    "architecture",
    "museums",
    "theater",
    "movies",
    "animation",
    "comics",
    "mythology",
    "fairy tales",
    "the ancient Greeks",
    "Shakespeare",
    "philosophy",
    "ethics",
    "happiness",
    "stress",
    "teamwork",
    "leadership",
    "negotiation",
    "customer service",
    "marketing",
    "branding",
    "email etiquette",
    "note taking",
    "studying for exams",
    "online courses",
    "teaching children to read",
    "kindness",
]

TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Give me five practical tips about {t}.",
    "Write a short story that involves {t}.",
    "Write a friendly email to a colleague about {t}.",
    "What are the pros and cons of {t}?",
    "Summarize the most important facts about {t} in a short paragraph.",
    "How do I get started with {t}? Give step-by-step instructions.",
    "Write a short poem about {t}.",
    "What are common misconceptions about {t}?",
    "Explain {t} to a ten-year-old.",
    "Write three quiz questions with answers about {t}.",
    "Why is {t} important? Answer in a few sentences.",
    "Compare {t} and {u}: how are they similar and how are they different?",
    "Write a short blog post introduction about {t}.",
    "Create a one-week plan for someone who wants to learn about {t}.",
    "Describe the history of {t} briefly.",
]

PASSAGE_MODULES = [
    "json",
    "csv",
    "argparse",
    "logging",
    "pathlib",
    "itertools",
    "functools",
    "collections",
    "datetime",
    "random",
    "statistics",
    "string",
    "textwrap",
    "unittest",
    "sqlite3",
    "threading",
    "subprocess",
    "shutil",
    "tempfile",
    "heapq",
    "bisect",
    "decimal",
    "fractions",
    "enum",
    "dataclasses",
    "typing",
    "contextlib",
    "abc",
    "copy",
    "pickle",
    "zipfile",
    "tarfile",
    "gzip",
    "hashlib",
    "hmac",
    "secrets",
    "uuid",
    "base64",
    "html",
    "urllib.parse",
    "email",
    "calendar",
    "time",
    "os",
    "sys",
    "re",
    "math",
    "cmath",
    "operator",
    "inspect",
    "ast",
    "dis",
    "traceback",
    "warnings",
    "weakref",
    "queue",
    "sched",
    "asyncio",
    "socket",
    "select",
    "signal",
    "mmap",
    "codecs",
    "unicodedata",
    "locale",
    "gettext",
    "pprint",
    "reprlib",
    "difflib",
    "filecmp",
    "glob",
    "fnmatch",
    "configparser",
    "plistlib",
    "timeit",
    "trace",
    "doctest",
    "zoneinfo",
    "graphlib",
    "array",
    "struct",
]
LANGUAGES = [
    "French",
    "German",
    "Spanish",
    "Italian",
    "Portuguese",
    "Chinese",
    "Japanese",
    "Russian",
]
ITEMS = [
    "apples",
    "notebooks",
    "tickets",
    "cupcakes",
    "pencils",
    "bus passes",
    "plants",
    "T-shirts",
    "books",
    "mugs",
]
NAMES = [
    "Tom",
    "Aisha",
    "Lena",
    "Ravi",
    "Maria",
    "Kenji",
    "Olu",
    "Sofia",
    "Ben",
    "Yara",
]


def _stdlib_module(name: str) -> ModuleType | None:
    """The module, or None where this platform's Python lacks it."""
    try:
        return importlib.import_module(name)
    except Exception:  # pragma: no cover - platform-specific modules
        return None


# --------------------------------------------------------------------------- coding requests


def _first_doc_line(obj) -> str | None:
    """The first line of `obj`'s docstring when it reads as a task description, else None."""
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    line = doc.strip().splitlines()[0].strip()
    if len(line) < 15 or len(line) > 160 or "(" in line[:1]:
        return None
    if line.lower().startswith(("deprecated", "alias", "internal", "see ")):
        return None
    if not any(c.isalpha() for c in line) or "->" in line:
        return None
    if line.endswith(")") and "(" in line.split(" ")[0]:  # a signature, not a sentence
        return None
    return line


def stdlib_prompts() -> list[str]:
    """Two coding requests per documented public function or class of `STDLIB_MODULES`.

    They come from the objects this process sees: a library that replaces a standard-library
    function changes them (gRPC, which Ray imports, swaps `inspect.isgenerator` for an
    undocumented wrapper, and its two prompts drop out). The training tools build the corpus in
    their own process, before importing any such library."""
    prompts = []
    for mod_name in STDLIB_MODULES:
        mod = _stdlib_module(mod_name)
        if mod is None:
            continue
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for name in sorted(set(names)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            line = _first_doc_line(obj)
            if line is None:
                continue
            qual = f"{mod_name}.{name}"
            # two of the four templates per object, chosen by its name
            h = sum(map(ord, qual))
            for k in (h % len(CODE_TEMPLATES), (h + 1) % len(CODE_TEMPLATES)):
                prompts.append(CODE_TEMPLATES[k].format(line=line, qual=qual))
    return prompts


# --------------------------------------------------------------------------- topics


def topic_prompts(seed: int = 0) -> list[str]:
    """Every topic with every template; the seed picks the other topic of each comparison."""
    rng = random.Random(seed + 1)
    prompts = []
    for i, t in enumerate(TOPICS):
        for tpl in TOPIC_TEMPLATES:
            u = TOPICS[(i + 1 + rng.randrange(len(TOPICS) - 1)) % len(TOPICS)]
            prompts.append(tpl.format(t=t, u=u))
    return prompts


# --------------------------------------------------------------------------- task prompts


def _module_passages() -> list[tuple[str, str]]:
    """(module name, start of its docstring) for the `PASSAGE_MODULES` with real prose."""
    out = []
    for name in PASSAGE_MODULES:
        mod = _stdlib_module(name)
        text = " ".join((inspect.getdoc(mod) or "").split())[:900] if mod is not None else ""
        if len(text) > 120:
            out.append((name, text))
    return out


def _sentences(passages: list[tuple[str, str]]) -> list[str]:
    out = []
    for _, text in passages:
        for s in text.split(". "):
            s = s.strip()
            if 40 <= len(s) <= 200 and s[0].isupper():
                out.append(s.rstrip(".") + ".")
    return out


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(3, 12)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    forms = [
        f"{name} buys {b} {item} at ${a} each and pays with ${a * b + rng.randint(1, 50)}. "
        f"How much change does {name} get? Explain step by step.",
        f"A class has {a + b} students. {b} of them are absent and the rest sit in groups of {c}. "
        "How many full groups are there, and how many students are left over?",
        f"{name} reads {c} pages a day. The book has {a * c + b} pages. "
        f"After how many days will {name} finish it? Show your reasoning.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"A train travels {a * c} km in {c} hours. "
        f"At the same speed, how far does it travel in {b} hours?",
        f"Solve for x: {a}x + {b} = {a * c + b}. Explain each step.",
        f"{name} saves ${a} every week. How many weeks does it take to save ${a * (b + c)}, "
        "and what if the weekly amount doubles?",
        f"What is {c}% of {a * 10 + b}? Then explain how to compute a percentage in general.",
    ]
    return rng.choice(forms)


def task_prompts(seed: int = 0) -> list[str]:
    """Translation, summarisation, passage-QA and arithmetic prompts (Spec-Bench's task kinds,
    none of its data)."""
    rng = random.Random(seed + 17)
    passages = _module_passages()
    prompts = []
    for i, sentence in enumerate(_sentences(passages)):
        language = LANGUAGES[i % len(LANGUAGES)]
        prompts.append(f"Translate the following sentence into {language}:\n\n{sentence}")
    for name, text in passages:
        prompts.append(f"Summarize the following text in two or three sentences:\n\n{text}")
        prompts.append(
            f"Read the passage and answer the question.\n\nPassage: {text}\n\nQuestion: "
            f"What is the `{name}` module used for, and what is one thing it provides?"
        )
        prompts.append(
            f"Here is some documentation:\n\n{text}\n\n"
            "Write a short tutorial paragraph for beginners based on it."
        )
    prompts += [_math_problem(rng) for _ in range(600)]
    return prompts


# --------------------------------------------------------------------------- the pools


def distill_prompts(num: int, seed: int = 0) -> list[str]:
    """The draft model's pool: `num` distinct coding and topic prompts (at least a third coding ones
    where there are enough), shuffled by `seed`."""
    code = list(dict.fromkeys(stdlib_prompts()))
    topics = list(dict.fromkeys(topic_prompts(seed)))
    rng = random.Random(seed)
    rng.shuffle(code)
    rng.shuffle(topics)
    n_code = min(len(code), max(num // 3, num - len(topics)))
    chosen = list(dict.fromkeys(code[:n_code] + topics[: num - n_code]))
    rng.shuffle(chosen)
    return chosen[:num]


def head_prompts(num: int, seed: int = 0) -> list[str]:
    """The draft head's pool: `num` distinct coding, topic and task prompts, shuffled by `seed`
    (fewer, with a note on stderr, when the sources hold fewer)."""
    pool = list(dict.fromkeys(stdlib_prompts() + topic_prompts(seed) + task_prompts(seed)))
    random.Random(seed).shuffle(pool)
    if num > len(pool):
        print(
            f"arborspec: only {len(pool)} distinct prompts available (asked for {num})",
            file=sys.stderr,
        )
    return pool[:num]
