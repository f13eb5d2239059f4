"""The run's configuration: what its options say, resolved into the frozen ``Settings``.

The options' table (``options.py``, which every pytest run imports: nothing else here is),
the settings resolved from them (``settings.py``), the run's targets as the options name them
(``targetoptions.py``) and its specs (``specoptions.py``), the run's outputs none of which is
an input (``outputs.py``), target URLs and their schemes (``targets.py``), a fleet's hosts as
rows and plain targets files (``hostlist.py``), Ansible inventories (``inventory.py``). The old
import paths (``pytest_gpuhost.options``, ``pytest_gpuhost.settings``, ...) re-export them.
"""
