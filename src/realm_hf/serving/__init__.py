"""`realm-hf serve`: a local web page and a JSON endpoint that answer questions with highlighted evidence.

[`create_app`] builds the web app (Starlette) over any answer function, so that it needs no model to import or test;
[`PipelineAnswerer`] is the answer function of an "open-qa" pipeline. Needs the "serve" extra:
`pip install 'realm_hf[serve]'`.
"""

from .answerer import PipelineAnswerer
from .app import LOOPBACK_HOSTS, create_app

__all__ = ["LOOPBACK_HOSTS", "PipelineAnswerer", "create_app"]
