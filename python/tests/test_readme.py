"""The README's Python examples: the quick start and examples/deepgemm_style.py (which must be
in the README verbatim) run as written."""
import os
import re
import runpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_blocks():
    with open(os.path.join(ROOT, 'README.md')) as f:
        return re.findall(r'```python\n(.*?)```', f.read(), re.S)


def test_readme_quick_start_runs():
    blocks = python_blocks()
    assert blocks, 'README.md has no python example'
    exec(compile(blocks[0], 'README.md quick start', 'exec'), {'__name__': '__main__'})


def test_deepgemm_style_script_is_in_readme_and_runs():
    path = os.path.join(ROOT, 'examples', 'deepgemm_style.py')
    with open(path) as f:
        script = f.read()
    assert any(b.strip() == script.strip() for b in python_blocks()), \
        'README.md must contain examples/deepgemm_style.py verbatim'
    runpy.run_path(path, run_name='__main__')
