"""In the benchmark repository: load pytest-gpuhost even where plugin autoloading is off
(PYTEST_DISABLE_PLUGIN_AUTOLOAD=1); with it on, the plugin is still registered only once."""

pytest_plugins = ["pytest_gpuhost"]
