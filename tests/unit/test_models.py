import pytest

from training.errors import ConfigError
from training.train import models


@pytest.mark.parametrize("shape", [(8, 8, 1), (28, 28, 1), (32, 32, 3)])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_builders_take_raw_pixels_and_output_class_probabilities(name, shape):
    model = models.build(name, shape, 10)
    assert model.input.dtype == "uint8"
    assert tuple(model.input.shape[1:]) == shape
    assert tuple(model.output.shape) == (None, 10)
    assert model.layers[1].__class__.__name__ == "Rescaling"


def test_mlp_is_the_seed_model():
    kinds = [layer.__class__.__name__ for layer in models.build("mlp", (28, 28, 1), 10).layers]
    assert kinds == ["InputLayer", "Rescaling", "Flatten", "Dense", "Dropout", "Dense"]


def test_cnn_is_the_seed_cifar_network_layer_for_layer():
    model = models.build("cnn", (32, 32, 3), 10)
    kinds = [layer.__class__.__name__ for layer in model.layers][2:]
    block = ["Conv2D", "BatchNormalization", "Conv2D", "BatchNormalization", "MaxPooling2D",
             "Dropout"]
    assert kinds == block + block + ["Flatten", "Dense", "BatchNormalization", "Dropout",
                                     "Dense"]
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert [c.filters for c in convs] == [32, 32, 64, 64]
    assert [c.padding for c in convs] == ["same", "valid", "same", "valid"]
    drops = [layer.rate for layer in model.layers if layer.__class__.__name__ == "Dropout"]
    assert drops == [0.25, 0.25, 0.5]


def test_unknown_model_is_a_config_error():
    with pytest.raises(ConfigError, match="model.name 'nope' is not a model: built in mlp, "
                                          "cnn, mobilenet_v3_small, efficientnet_b0, "
                                          "resnet50; installed"):
        models.build("nope", (8, 8, 1), 10)


def test_registering_a_model_is_one_function():
    @models.register("tiny_for_test")
    def tiny(input_shape, num_classes):
        import keras

        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(
            inputs)))

    try:
        assert models.build("tiny_for_test", (4, 4, 1), 3).output.shape[-1] == 3
        with pytest.raises(ValueError, match="already registered"):
            models.register("tiny_for_test")(tiny)
    finally:
        del models.MODELS["tiny_for_test"]


BACKBONES = ["mobilenet_v3_small", "efficientnet_b0", "resnet50"]


def test_the_backbones_are_built_in_after_the_seed_models():
    assert models.names()[:5] == ["mlp", "cnn", *BACKBONES]


@pytest.mark.parametrize(("args", "message"), [
    ({"image_size": 16}, "model.args.image_size of model 'resnet50' must be between 32 and "
                         "1024, got 16"),
    ({"dropout": 1.5}, "model.args.dropout of model 'resnet50' must be between 0.0 and 0.9, "
                       "got 1.5"),
    ({"flip": 1}, "model.args.flip of model 'resnet50' must be true or false, got 1 (int)"),
    ({"size": 64}, "model.args: 'size' is not an argument of model 'resnet50'; its arguments: "
                   "image_size (int, default 96, between 32 and 1024), dropout (float, "
                   "default 0.2, between 0.0 and 0.9), flip (bool, default False), rotation "
                   "(float, default 0.0, between 0.0 and 0.5), zoom (float, default 0.0, "
                   "between 0.0 and 0.9)"),
])
def test_backbone_arguments_are_checked_against_their_bounds(args, message):
    with pytest.raises(ConfigError) as err:
        models.check_args("resnet50", models.resolve("resnet50"), args)
    assert str(err.value) == message


def test_bounds_only_on_numbers():
    from typing import Annotated

    def bounded_name(shape, classes, *, kind: Annotated[str, models.Between(0, 1)] = "a"):
        return None

    with pytest.raises(ConfigError, match="^model 'x': argument 'kind' is a str: Between "
                                          "bounds only int and float$"):
        models.parameters("x", bounded_name)


@pytest.mark.parametrize("name", BACKBONES)
def test_a_backbone_resizes_grey_digits_to_rgb_and_keeps_augmentation_out_of_inference(name):
    import numpy as np

    model = models.build(name, (28, 28, 1), 10, {"image_size": 32, "flip": True,
                                                 "rotation": 0.2, "zoom": 0.2})
    names = [layer.name for layer in model.layers]
    assert names[:5] == ["image", "pixels", "resize", "grey_to_rgb", "augment"]
    assert names[-3:] == ["backbone", "head_dropout", "classifier"]
    assert model.get_layer("backbone").input.shape[1:] == (32, 32, 3)
    augment = model.get_layer("augment")
    assert [layer.__class__.__name__ for layer in augment.layers] == [
        "RandomFlip", "RandomRotation", "RandomZoom"]
    images = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    assert np.array_equal(np.asarray(augment(images, training=False)), images)
    assert not np.allclose(np.asarray(augment(images, training=True)), images)


def test_resnet50_gets_the_caffe_input_its_weights_expect():
    import keras
    import numpy as np

    model = models.build("resnet50", (32, 32, 3), 10, {"image_size": 32})
    # Without augmentation arguments there is no augment layer; RGB input is not copied.
    names = [layer.name for layer in model.layers]
    assert "augment" not in names and "grey_to_rgb" not in names
    caffe = model.get_layer("caffe_input")
    assert not caffe.trainable and not caffe.trainable_weights
    image = np.zeros((1, 32, 32, 3), dtype="uint8")
    image[..., 0], image[..., 1], image[..., 2] = 200, 100, 50  # R, G, B
    out = np.asarray(keras.Model(model.input, caffe.output)(image))[0, 0, 0]
    assert out == pytest.approx([50 - 103.939, 100 - 116.779, 200 - 123.68], abs=1e-3)


def test_a_backbone_model_needs_no_custom_object_to_load(tmp_path):
    import keras

    model = models.build("mobilenet_v3_small", (28, 28, 1), 3, {"image_size": 32,
                                                                "flip": True})
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]


def test_a_backbone_refuses_images_it_cannot_turn_into_rgb():
    with pytest.raises(ConfigError, match="model 'efficientnet_b0' failed to build for input "
                                          r"\(32, 32, 4\) and 10 classes \(ValueError: "
                                          "efficientnet_b0 takes images with 1 or 3 channels, "
                                          "got 4\\)"):
        models.build("efficientnet_b0", (32, 32, 4), 10, {"image_size": 32})
